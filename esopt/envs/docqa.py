"""Document question answering with page tools: find a fact in a multi-page document.

Documents are generated from seeds (no data files): invoices, claim forms, shipment tables and
short reports, 2-4 pages of plain text each (configurable). Every task asks one question whose
answer is an exact span of the document: a date, an amount, a name, an id. The agent reads the
document through tools, one action per reply:

    list_pages              -> page numbers and section titles
    read_page 2             -> the text of page 2
    search invoice date     -> matching lines with page numbers (case-insensitive substring)
    answer: March 4, 2024   -> ends the episode

(`tools.parse_action` also accepts "read page 2", read_page(2), "Final answer: ...", etc.) A
malformed reply or a bad page number gets feedback and uses up the turn (info["invalid"]).

Reward, on the answer turn: ANLS against the gold answers (DocVQA's: 1 - normalised Levenshtein
distance, 0 when the distance is >= 0.5), or exact match with ``metric: exact``; info carries
both ("anls", "exact") and success = exact match. No answer within `max_turns` scores 0.

Splits: a (document, question) pair belongs to train or eval by a hash of its text, so the two
never overlap. Task data: ``{"kind", "title", "pages": [str], "page_titles": [str], "question",
"answers": [str], "field", "answer_page": int (1-based)}``.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from esopt.confutil import ConfigError, opt
from esopt.envs.base import Env, Episode, StepResult, Task, check_split
from esopt.envs.metrics import anls, exact_match
from esopt.envs.tools import ANSWER, TOOL, hash_split, parse_action, short_hash, stable_int, truncate

DOC_TYPES = ("invoice", "form", "table", "report")
TOOLS = ("list_pages", "read_page", "search")
METRICS = ("anls", "exact")

# ----------------------------------------------------------------------------------------------
# Word pools (invented; any resemblance to real entities is coincidental)
# ----------------------------------------------------------------------------------------------

FIRST = [
    "Alice", "Bruno", "Chloe", "Dmitri", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kara",
    "Liam", "Maya", "Nikhil", "Olga", "Pedro", "Quinn", "Rosa", "Samir", "Tara", "Umar", "Vera",
    "Wen", "Ximena", "Yusuf", "Zoe", "Amara", "Bjorn", "Carmen", "Derek", "Esther", "Felix",
    "Greta", "Hamid", "Ivy", "Jamal", "Keiko", "Lars", "Mina", "Noah", "Priya", "Rafael", "Sofia",
    "Tomas", "Ulla", "Victor", "Willa", "Yara",
]
LAST = [
    "Abbott", "Baptiste", "Castillo", "Delacroix", "Eriksen", "Fontaine", "Gallagher", "Haddad",
    "Ibsen", "Jablonski", "Kowalski", "Lindqvist", "Moreau", "Nakamura", "Okafor", "Petrov",
    "Quintero", "Rasmussen", "Santoro", "Takahashi", "Ulrich", "Vasquez", "Whitfield", "Xu",
    "Yamamoto", "Zielinski", "Brennan", "Carver", "Dunmore", "Ellison", "Ferreira", "Grimaldi",
    "Holloway", "Iverson", "Jovanovic", "Kimura", "Lombardi", "Mbeki", "Novak", "Ortega",
    "Pemberton", "Rhodes", "Sandoval", "Thornton", "Valente", "Winslow",
]
CO_A = [
    "Blue Harbor", "Northwind", "Silver Oak", "Redstone", "Brightpath", "Cedar Point", "Ironbridge",
    "Lakeside", "Maple Ridge", "Summit", "Granite Peak", "Riverbend", "Sunfield", "Westgate",
    "Copperleaf", "Harborview", "Pinecrest", "Starling", "Tidewater", "Evergreen",
]
CO_B = [
    "Logistics", "Supplies", "Analytics", "Manufacturing", "Consulting", "Foods", "Systems",
    "Textiles", "Energy", "Software", "Instruments", "Freight", "Labs", "Design", "Medical",
]
CO_SUFFIX = ["Ltd", "LLC", "Inc", "GmbH", "Co", "Group", "Partners"]
STREETS = [
    "Elm Street", "Harbor Road", "Kings Avenue", "Mill Lane", "Oak Boulevard", "Station Road",
    "Park Place", "Willow Way", "Quarry Drive", "Beacon Street", "Orchard Lane", "Canal Road",
]
CITIES = [
    "Springfield", "Riverton", "Lakewood", "Fairview", "Greenville", "Bristol", "Ashford",
    "Kingsport", "Milton", "Westbury", "Northam", "Clearwater", "Oakdale", "Brookfield",
]
ITEMS = [
    "Desk Lamp", "Office Chair", "Laptop Stand", "Wireless Mouse", "USB-C Hub", "Printer Paper",
    "Monitor Arm", "Filing Cabinet", "Whiteboard", "Label Printer", "Ink Cartridge", "Keyboard",
    "Webcam", "Headset", "Desk Organizer", "Cable Tray", "Paper Shredder", "Projector",
    "Extension Cord", "Storage Box", "Safety Gloves", "Toner Kit", "Network Switch", "Router",
]
SERVICES = [
    "Installation Service", "Annual Maintenance", "Training Session", "Consulting Hours",
    "Data Migration", "Support Plan", "Site Survey", "Equipment Rental",
]
CARRIERS = ["FastShip", "BlueLine Cargo", "Northstar Express", "Orbit Freight", "Swift Parcel", "TransCo"]
DEPARTMENTS = ["Finance", "Operations", "Sales", "Research", "Logistics", "Customer Support", "Facilities"]
TITLES = ["Operations Manager", "Finance Director", "Project Lead", "Senior Analyst", "Head of Sales",
          "Quality Officer", "Program Coordinator"]
INCIDENTS = ["a rear-end collision", "water damage from a burst pipe", "a kitchen fire", "storm damage to the roof",
             "a break-in and theft", "a fallen tree on the garage"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December"]
FILLER = [
    "All amounts are stated in the currency shown unless otherwise noted.",
    "Please retain this document for your records.",
    "Questions about this document may be directed to the contact listed above.",
    "This document was generated electronically and is valid without a signature.",
    "Late payments may be subject to a fee as described in the terms.",
    "Goods remain the property of the seller until paid in full.",
    "Any discrepancies must be reported within 14 days of receipt.",
    "Information in this document is confidential and intended for the addressee only.",
    "Figures are rounded to the nearest cent.",
    "The terms printed overleaf form part of this agreement.",
]


# ----------------------------------------------------------------------------------------------
# Value generators
# ----------------------------------------------------------------------------------------------


class _Gen:
    """Random values for one document; never repeats a value within the document."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set()
        self.date_style = rng.randrange(3)
        self.currency = rng.choice(["$", "$", "EUR ", "GBP "])

    def unique(self, make) -> str:
        for _ in range(1000):
            v = make()
            if v not in self.used:
                self.used.add(v)
                return v
        raise RuntimeError("could not draw a unique value")

    def person(self) -> str:
        r = self.rng
        return self.unique(lambda: f"{r.choice(FIRST)} {r.choice(LAST)}")

    def company(self) -> str:
        r = self.rng
        return self.unique(lambda: f"{r.choice(CO_A)} {r.choice(CO_B)} {r.choice(CO_SUFFIX)}")

    def address(self) -> str:
        r = self.rng
        return f"{r.randint(1, 980)} {r.choice(STREETS)}, {r.choice(CITIES)} {r.randint(10000, 99999)}"

    def ident(self, prefix: str, digits: int = 5, letters: int = 0) -> str:
        r = self.rng

        def make() -> str:
            core = "".join(r.choice("ABCDEFGHJKLMNPQRSTUVWXYZ") for _ in range(letters))
            core += "".join(r.choice("0123456789") for _ in range(digits))
            return f"{prefix}-{core}" if prefix else core

        return self.unique(make)

    def day(self, year: int | None = None) -> tuple[int, int, int]:
        r = self.rng
        return (year or r.randint(2019, 2025), r.randint(1, 12), r.randint(1, 28))

    def fmt_date(self, ymd: tuple[int, int, int]) -> str:
        y, m, d = ymd
        if self.date_style == 0:
            return f"{MONTHS[m - 1]} {d}, {y}"
        if self.date_style == 1:
            return f"{y}-{m:02d}-{d:02d}"
        return f"{d} {MONTHS[m - 1][:3]} {y}"

    def date(self, year: int | None = None) -> str:
        return self.unique(lambda: self.fmt_date(self.day(year)))

    def later(self, ymd: tuple[int, int, int], days: int) -> tuple[int, int, int]:
        y, m, d = ymd
        d += days
        while d > 28:
            d -= 28
            m += 1
            if m > 12:
                m, y = 1, y + 1
        return (y, m, d)

    def money(self, cents: int) -> str:
        return f"{self.currency}{cents / 100:,.2f}"


def _amount_variants(span: str) -> list[str]:
    """The span, plus the bare number without a currency marker."""
    bare = re.sub(r"^(?:\$|EUR |GBP )", "", span)
    return [span] if bare == span else [span, bare]


@dataclass
class _QA:
    question: str
    answer: str
    field: str
    variants: list[str] | None = None
    anchor: str | None = None
    """Text on the same line as the answer that locates it (default: the answer itself)."""

    def golds(self) -> list[str]:
        return self.variants or [self.answer]


@dataclass
class _Doc:
    kind: str
    title: str
    blocks: list[tuple[str, list[str]]]
    qas: list[_QA]


# ----------------------------------------------------------------------------------------------
# Document kinds
# ----------------------------------------------------------------------------------------------


def _filler_block(g: _Gen, heading: str) -> tuple[str, list[str]]:
    return heading, g.rng.sample(FILLER, 3)


def _invoice(g: _Gen) -> _Doc:
    r = g.rng
    vendor, client = g.company(), g.company()
    contact, manager = g.person(), g.person()
    inv_no = g.ident("INV", 6)
    po = g.ident("PO", 5)
    cust = g.ident("CUST", 4)
    issued = g.day()
    inv_date = g.fmt_date(issued)
    g.used.add(inv_date)
    terms = r.choice([14, 30, 45])
    due_date = g.fmt_date(g.later(issued, terms))
    g.used.add(due_date)
    lines = r.sample(ITEMS + SERVICES, r.randint(3, 6))
    rows, subtotal = [], 0
    item_q = []
    for name in lines:
        qty = r.randint(1, 12)
        unit = r.randint(5, 900) * 100 + r.choice([0, 50, 99, 25])
        amt = qty * unit
        subtotal += amt
        rows.append(f"{name} | {qty} | {g.money(unit)} | {g.money(amt)}")
        item_q.append((name, g.money(unit), g.money(amt)))
    tax_rate = r.choice([5, 7, 8, 10, 20])
    tax = round(subtotal * tax_rate / 100)
    shipping = r.randint(0, 90) * 100
    total = subtotal + tax + shipping
    account = g.ident("", 10)
    blocks = [
        ("Invoice header", [
            f"{vendor}", f"{g.address()}", "INVOICE",
            f"Invoice No: {inv_no}", f"Invoice Date: {inv_date}", f"Due Date: {due_date}",
            f"PO Number: {po}",
        ]),
        ("Billing details", [
            "Bill To:", f"{contact}", f"{client}", f"{g.address()}",
            f"Customer ID: {cust}", f"Account Manager: {manager}",
        ]),
        ("Line items", ["Description | Qty | Unit Price | Amount", *rows]),
        ("Totals", [
            f"Subtotal: {g.money(subtotal)}", f"Tax ({tax_rate}%): {g.money(tax)}",
            f"Shipping: {g.money(shipping)}", f"Total Due: {g.money(total)}",
        ]),
        ("Payment", [
            f"Payment Terms: Net {terms}", f"Bank Account No: {account}",
            f"Please quote {inv_no} with your payment.",
        ]),
        _filler_block(g, "Notes"),
    ]
    name, unit, amt = r.choice(item_q)
    m = lambda s: _amount_variants(s)  # noqa: E731
    qas = [
        _QA("What is the invoice number?", inv_no, "invoice_number"),
        _QA("What is the invoice date?", inv_date, "invoice_date"),
        _QA("When is the payment due?", due_date, "due_date"),
        _QA("What is the PO number?", po, "po_number"),
        _QA("Who is the invoice billed to (contact name)?", contact, "bill_to_contact"),
        _QA("What is the customer ID?", cust, "customer_id"),
        _QA("Who is the account manager?", manager, "account_manager"),
        _QA("What is the total amount due?", g.money(total), "total_due", m(g.money(total))),
        _QA("What is the subtotal?", g.money(subtotal), "subtotal", m(g.money(subtotal))),
        _QA("How much tax is charged?", g.money(tax), "tax", m(g.money(tax))),
        _QA(f"What is the unit price of {name}?", unit, "unit_price", m(unit), anchor=name),
        _QA(f"What is the line amount for {name}?", amt, "line_amount", m(amt), anchor=name),
        _QA("What is the bank account number for payment?", account, "bank_account"),
    ]
    return _Doc("invoice", f"Invoice from {vendor}", blocks, qas)


def _form(g: _Gen) -> _Doc:
    r = g.rng
    insurer = g.company()
    claimant, adjuster, witness = g.person(), g.person(), g.person()
    claim_no = g.ident("CLM", 5, 2)
    policy = g.ident("POL", 7)
    incident = g.day()
    inc_date = g.fmt_date(incident)
    g.used.add(inc_date)
    filed = g.fmt_date(g.later(incident, r.randint(1, 20)))
    g.used.add(filed)
    dob = g.date(r.randint(1950, 2000))
    phone = g.unique(lambda: f"+1 {r.randint(200, 989)}-{r.randint(200, 989)}-{r.randint(1000, 9999)}")
    police = g.ident("PR", 6)
    adjuster_id = g.ident("ADJ", 4)
    damage = g.money(r.randint(300, 40000) * 100 + r.choice([0, 50]))
    deductible = g.money(r.choice([250, 500, 1000, 1500]) * 100)
    what = r.choice(INCIDENTS)
    place = f"{r.choice(STREETS)}, {r.choice(CITIES)}"
    blocks = [
        ("Claim form", [
            f"{insurer}", "PROPERTY AND VEHICLE CLAIM FORM",
            f"Claim Number: {claim_no}", f"Policy Number: {policy}", f"Date Filed: {filed}",
        ]),
        ("Claimant", [
            f"Claimant Name: {claimant}", f"Date of Birth: {dob}", f"Phone: {phone}",
            f"Address: {g.address()}",
        ]),
        ("Incident details", [
            f"Date of Incident: {inc_date}", f"Location: {place}",
            f"Description: The claimant reports {what}.",
            f"Police Report No: {police}", f"Witness: {witness}",
        ]),
        ("Assessment", [
            f"Estimated Damage: {damage}", f"Deductible: {deductible}",
            f"Assigned Adjuster: {adjuster}", f"Adjuster ID: {adjuster_id}",
        ]),
        _filler_block(g, "Declaration"),
    ]
    m = _amount_variants
    qas = [
        _QA("What is the claim number?", claim_no, "claim_number"),
        _QA("What is the policy number?", policy, "policy_number"),
        _QA("On what date did the incident happen?", inc_date, "incident_date"),
        _QA("On what date was the claim filed?", filed, "date_filed"),
        _QA("What is the claimant's name?", claimant, "claimant"),
        _QA("What is the claimant's date of birth?", dob, "date_of_birth"),
        _QA("What is the claimant's phone number?", phone, "phone"),
        _QA("What is the police report number?", police, "police_report"),
        _QA("Who is the witness?", witness, "witness"),
        _QA("What is the estimated damage?", damage, "estimated_damage", m(damage)),
        _QA("Who is the assigned adjuster?", adjuster, "adjuster"),
        _QA("What is the adjuster ID?", adjuster_id, "adjuster_id"),
    ]
    return _Doc("form", f"Claim form from {insurer}", blocks, qas)


def _table(g: _Gen) -> _Doc:
    r = g.rng
    company = g.company()
    preparer = g.person()
    report_id = g.ident("LOG", 5)
    year = r.randint(2019, 2025)
    n_rows = r.randint(8, 16)
    rows = []
    for _ in range(n_rows):
        sid = g.ident("SH", 5)
        date = g.date(year)
        dest = r.choice(CITIES)
        carrier = r.choice(CARRIERS)
        weight = f"{r.randint(1, 2400)}.{r.randint(0, 9)}"
        cost = g.money(r.randint(20, 9000) * 100 + r.choice([0, 25, 50, 75]))
        rows.append((sid, date, dest, carrier, weight, cost))
    header = "Shipment ID | Date | Destination | Carrier | Weight (kg) | Cost"
    blocks = [("Summary", [
        f"{company}", f"SHIPMENT LOG {year}", f"Log ID: {report_id}", f"Prepared by: {preparer}",
        f"Shipments listed: {n_rows}",
    ])]
    per = max(3, (n_rows + 2) // 3)
    for k in range(0, n_rows, per):
        part = rows[k : k + per]
        blocks.append((f"Shipments {k + 1}-{k + len(part)}", [header, *(" | ".join(x) for x in part)]))
    blocks.append(_filler_block(g, "Notes"))
    sid, date, dest, carrier, weight, cost = r.choice(rows)
    qas = [
        _QA(f"What was the cost of shipment {sid}?", cost, "shipment_cost", _amount_variants(cost), sid),
        _QA(f"On what date was shipment {sid} sent?", date, "shipment_date", anchor=sid),
        _QA(f"What was the weight in kg of shipment {sid}?", weight, "shipment_weight", anchor=sid),
        _QA(f"Which carrier handled shipment {sid}?", carrier, "carrier", anchor=sid),
        _QA(f"What was the destination of shipment {sid}?", dest, "destination", anchor=sid),
        _QA("Who prepared the shipment log?", preparer, "preparer"),
        _QA("What is the log ID?", report_id, "log_id"),
    ]
    return _Doc("table", f"Shipment log of {company}", blocks, qas)


def _report(g: _Gen) -> _Doc:
    r = g.rng
    company = g.company()
    author, lead, sponsor = g.person(), g.person(), g.person()
    title = r.choice(TITLES)
    dept = r.choice(DEPARTMENTS)
    rpt = g.ident("RPT", 5)
    year = r.randint(2019, 2025)
    q = r.randint(2, 4)
    issued = g.date(year)
    review = g.date(year)
    revenue = g.unique(lambda: g.money(r.randint(50_000, 9_000_000) * 100))
    prev = g.unique(lambda: g.money(r.randint(50_000, 9_000_000) * 100))
    budget = g.unique(lambda: g.money(r.randint(10_000, 900_000) * 100))
    project = g.ident("PRJ", 4)
    headcount = str(r.randint(12, 480))
    blocks = [
        ("Cover", [
            f"{company}", f"{dept.upper()} QUARTERLY REPORT, Q{q} {year}", f"Report No. {rpt}",
            f"Prepared by {author}, {title}", f"Issued {issued}",
        ]),
        ("Results", [
            f"Revenue for Q{q} reached {revenue}, compared with {prev} in Q{q - 1}.",
            f"The {dept} department ended the quarter with a headcount of {headcount}.",
        ]),
        ("Projects", [
            f"Project {project} is led by {lead} and is sponsored by {sponsor}.",
            f"The board approved a budget of {budget} for the next quarter.",
        ]),
        ("Outlook", [
            f"The next review meeting is scheduled for {review}.",
            "Risks remain moderate; supplier lead times are being monitored.",
        ]),
        _filler_block(g, "Notes"),
    ]
    m = _amount_variants
    qas = [
        _QA("Who prepared the report?", author, "author"),
        _QA("What is the report number?", rpt, "report_number"),
        _QA("When was the report issued?", issued, "issued"),
        _QA(f"What was the revenue for Q{q}?", revenue, "revenue", m(revenue)),
        _QA(f"What was the revenue in Q{q - 1}?", prev, "previous_revenue", m(prev)),
        _QA("What budget did the board approve for the next quarter?", budget, "budget", m(budget)),
        _QA(f"Who leads project {project}?", lead, "project_lead"),
        _QA(f"Who sponsors project {project}?", sponsor, "project_sponsor"),
        _QA("When is the next review meeting?", review, "next_review"),
        _QA(f"What is the headcount of the {dept} department?", headcount, "headcount"),
    ]
    return _Doc("report", f"{dept} quarterly report of {company}", blocks, qas)


_GENERATORS = {"invoice": _invoice, "form": _form, "table": _table, "report": _report}


def _paginate(blocks: list[tuple[str, list[str]]], n_pages: int) -> tuple[list[str], list[str]]:
    """Split the blocks, in order, into `n_pages` contiguous groups of about equal line counts."""
    n_pages = max(1, min(n_pages, len(blocks)))
    sizes = [len(lines) + 1 for _, lines in blocks]
    total = sum(sizes)
    groups: list[list[int]] = [[] for _ in range(n_pages)]
    acc, page = 0, 0
    for i, size in enumerate(sizes):
        left_blocks = len(blocks) - i
        left_pages = n_pages - page
        if groups[page] and (acc >= total * (page + 1) / n_pages or left_blocks < left_pages) and page < n_pages - 1:
            page += 1
        groups[page].append(i)
        acc += size
    pages, titles = [], []
    for grp in groups:
        text = []
        for i in grp:
            heading, lines = blocks[i]
            text.append(f"[{heading}]")
            text.extend(lines)
        pages.append("\n".join(text))
        titles.append(", ".join(blocks[i][0] for i in grp))
    return pages, titles


def generate_document(kind: str, rng: random.Random, n_pages: int) -> dict:
    """One document of `kind` with its questions: {"title", "pages", "page_titles", "qas"}."""
    g = _Gen(rng)
    doc = _GENERATORS[kind](g)
    blocks = list(doc.blocks)
    while len(blocks) < n_pages:  # too few sections for the pages asked for: add appendices
        blocks.append(_filler_block(g, f"Appendix {chr(ord('A') + len(blocks) - len(doc.blocks))}"))
    pages, titles = _paginate(blocks, n_pages)
    return {"kind": kind, "title": doc.title, "pages": pages, "page_titles": titles, "qas": doc.qas}


# ----------------------------------------------------------------------------------------------
# Env
# ----------------------------------------------------------------------------------------------


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass
class DocQAConfig:
    doc_types: list[str] = opt(list(DOC_TYPES), f"Document kinds to draw from: any of {', '.join(DOC_TYPES)}.")
    min_pages: int = opt(2, "Fewest pages per document (>= 1).")
    max_pages: int = opt(4, "Most pages per document (<= 6).")
    metric: str = opt("anls", "Reward metric: anls (DocVQA's, threshold below) or exact.")
    anls_threshold: float = opt(0.5, "ANLS: a normalised edit distance at or above this scores 0.")
    max_turns: int = opt(6, "Turns per episode (tool calls and the answer all count).")
    show_first_page: bool = opt(False, "Include page 1 in the first observation.")
    max_search_results: int = opt(5, "Most matching lines a search returns.")
    max_observation_chars: int = opt(1500, "Tool output longer than this is cut.")

    def __post_init__(self) -> None:
        kinds = self.doc_types
        if not isinstance(kinds, (list, tuple)) or not kinds or not all(k in DOC_TYPES for k in kinds):
            raise ConfigError(f"docqa.doc_types must be a non-empty list drawn from {list(DOC_TYPES)}, got {kinds!r}")
        self.doc_types = list(dict.fromkeys(kinds))
        for name in ("min_pages", "max_pages", "max_turns", "max_search_results", "max_observation_chars"):
            if not _is_int(getattr(self, name)):
                raise ConfigError(f"docqa.{name} must be an integer, got {getattr(self, name)!r}")
        if not 1 <= self.min_pages <= self.max_pages <= 6:
            raise ConfigError(
                f"docqa.min_pages/max_pages must satisfy 1 <= min <= max <= 6, got {self.min_pages}/{self.max_pages}"
            )
        if self.metric not in METRICS:
            raise ConfigError(f"docqa.metric must be one of {list(METRICS)}, got {self.metric!r}")
        if isinstance(self.anls_threshold, bool) or not isinstance(self.anls_threshold, (int, float)) or not (
            0 < self.anls_threshold <= 1
        ):
            raise ConfigError(f"docqa.anls_threshold must be in (0, 1], got {self.anls_threshold!r}")
        if self.max_turns < 1:
            raise ConfigError(f"docqa.max_turns must be >= 1, got {self.max_turns}")
        if self.max_search_results < 1:
            raise ConfigError(f"docqa.max_search_results must be >= 1, got {self.max_search_results}")
        if self.max_observation_chars < 100:
            raise ConfigError(f"docqa.max_observation_chars must be >= 100, got {self.max_observation_chars}")
        if not isinstance(self.show_first_page, bool):
            raise ConfigError(f"docqa.show_first_page must be true or false, got {self.show_first_page!r}")


class DocQAEnv(Env):
    """Answer a question about a generated multi-page document using page tools."""

    name = "docqa"
    Config = DocQAConfig

    def __init__(self, config: DocQAConfig | None = None):
        super().__init__(config)
        self.config: DocQAConfig

    @property
    def max_turns(self) -> int:
        return self.config.max_turns

    @property
    def system_prompt(self) -> str:
        return "\n".join([
            "Answer a question about a document. You cannot see the document; use the tools.",
            "Each reply must be ONE of these lines:",
            "list_pages   (shows the page titles)",
            "read_page <n>   (example: read_page 2)",
            "search <words>   (example: search due date)",
            "answer: <text copied exactly from the document>",
            f"You have {self.config.max_turns} turns; reply with answer: before they run out.",
        ])

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        check_split(split)
        if not _is_int(n) or n < 0:
            raise ValueError(f"n must be a non-negative integer, got {n!r}")
        c = self.config
        out: list[Task] = []
        seen: set[str] = set()
        attempt = 0
        while len(out) < n:
            if attempt > 200 * n + 1000:
                raise RuntimeError(f"docqa: could not draw {n} distinct {split} tasks")
            rng = random.Random(stable_int(f"esopt-docqa|{split}|{seed}|{attempt}"))
            attempt += 1
            kind = rng.choice(c.doc_types)
            doc = generate_document(kind, rng, rng.randint(c.min_pages, c.max_pages))
            qa: _QA = rng.choice(doc["qas"])
            text = "\n\f\n".join(doc["pages"])
            key = f"{text}\n\f\n{qa.question}"
            if key in seen or hash_split("docqa", key) != split:
                continue
            seen.add(key)
            anchor = qa.anchor or qa.answer
            page = next(
                i for i, p in enumerate(doc["pages"], 1)
                if any(qa.answer in line and anchor in line for line in p.split("\n"))
            )
            out.append(Task(
                id=f"docqa-{kind}-{short_hash(key)}",
                data={
                    "kind": kind, "title": doc["title"], "pages": doc["pages"],
                    "page_titles": doc["page_titles"], "question": qa.question,
                    "answers": qa.golds(), "field": qa.field, "answer_page": page,
                },
            ))
        return out

    def oracle(self, task: Task):
        """Read the page that holds the answer (when there are turns for it), then answer with its span."""
        reading = [f"read_page {task.data['answer_page']}"] if self.max_turns > 1 else []
        actions = iter([*reading, f"answer: {task.data['answers'][0]}"])
        return lambda observation: next(actions)

    def start(self, task: Task) -> "DocQAEpisode":
        return DocQAEpisode(self, task)


_INT = re.compile(r"-?\d+")


class DocQAEpisode(Episode):
    def __init__(self, env: DocQAEnv, task: Task):
        self.env = env
        self.config: DocQAConfig = env.config
        self.task = task
        self.pages: list[str] = list(task.data["pages"])
        self.titles: list[str] = list(task.data.get("page_titles") or [f"page {i}" for i in range(1, len(self.pages) + 1)])
        self.golds: list[str] = list(task.data["answers"])
        self.turn = 0
        self.tool_calls = 0
        self.done = False
        n = len(self.pages)
        obs = [
            f"Document: {task.data.get('title', 'untitled')} ({n} page{'s' if n != 1 else ''}).",
            f"Question: {task.data['question']}",
        ]
        if self.config.show_first_page and self.pages:
            obs.append(f"Page 1 of {n}:\n{self.pages[0]}")
        obs.append("Use list_pages, read_page <n> or search <words>; reply answer: <text> when you know.")
        self._observation = "\n".join(obs)

    @property
    def observation(self) -> str:
        return self._observation

    def _list_pages(self) -> str:
        return "Pages:\n" + "\n".join(f"{i}: {t}" for i, t in enumerate(self.titles, 1))

    def _read_page(self, arg: str) -> tuple[str, bool]:
        n = len(self.pages)
        m = _INT.search(arg or "")
        if not m or len(m.group()) > 6:
            return f"read_page needs a page number 1-{n}, e.g. read_page 1", False
        k = int(m.group())
        if not 1 <= k <= n:
            return f"There is no page {k}; pages are 1-{n}.", False
        return truncate(f"Page {k} of {n}:\n{self.pages[k - 1]}", self.config.max_observation_chars), True

    def _search(self, arg: str) -> tuple[str, bool]:
        q = " ".join((arg or "").split()).strip("\"'`")
        if not q:
            return "search needs some words, e.g. search total", False
        if len(q) > 200:
            return "search text too long (max 200 characters)", False
        hits = self._hits(q)
        if not hits and q.lower().startswith("for "):
            q = q[4:].strip()
            hits = self._hits(q)
        if not hits:
            return f"No lines contain '{q}'.", True
        k = self.config.max_search_results
        lines = [f"p{p}: {truncate(line, 200)}" for p, line in hits[:k]]
        if len(hits) > k:
            lines.append(f"... and {len(hits) - k} more")
        return truncate(f"Lines containing '{q}':\n" + "\n".join(lines), self.config.max_observation_chars), True

    def _hits(self, q: str) -> list[tuple[int, str]]:
        ql = q.lower()
        return [
            (p, line) for p, page in enumerate(self.pages, 1) for line in page.split("\n")
            if ql in " ".join(line.split()).lower()
        ]

    def step(self, action: str) -> StepResult:
        if self.done:
            return StepResult(self._observation, 0.0, True, {"invalid": True, "error": "the episode is already over"})
        c = self.config
        self.turn += 1
        info: dict = {"invalid": False, "turn": self.turn}
        act = parse_action(action, TOOLS)
        if act.kind == ANSWER and act.arg.strip():
            pred = act.arg.strip()
            a = anls(pred, self.golds, threshold=c.anls_threshold)
            e = exact_match(pred, self.golds)
            reward = a if c.metric == "anls" else e
            self.done = True
            info.update(success=e == 1.0, answer=pred, anls=a, exact=e, tool_calls=self.tool_calls)
            self._observation = ("Correct!" if e == 1.0 else "Answer recorded.") + " The episode is over."
            return StepResult(self._observation, float(reward), True, info)
        if act.kind == TOOL:
            self.tool_calls += 1
            info["tool"] = act.tool
            if act.tool == "list_pages":
                feedback, ok = self._list_pages(), True
            elif act.tool == "read_page":
                feedback, ok = self._read_page(act.arg)
            else:
                feedback, ok = self._search(act.arg)
            if not ok:
                info["invalid"] = True
                info["error"] = feedback
        else:
            info["invalid"] = True
            info["error"] = "empty answer" if act.kind == ANSWER else (act.error or "unreadable reply")
            feedback = (
                f"Invalid reply ({info['error']}). Reply with one of: list_pages | read_page <n> | "
                "search <words> | answer: <text>"
            )
        if self.turn >= c.max_turns:
            self.done = True
            info.update(success=False, answer=None, anls=0.0, exact=0.0, tool_calls=self.tool_calls)
            self._observation = f"{feedback}\nOut of turns without an answer. The episode is over."
            return StepResult(self._observation, 0.0, True, info)
        left = c.max_turns - self.turn
        note = "Last turn: reply with answer: <text>." if left == 1 else f"Turns left: {left}."
        self._observation = f"{feedback}\n{note}"
        return StepResult(self._observation, 0.0, False, info)
