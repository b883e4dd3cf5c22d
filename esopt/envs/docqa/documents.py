"""Seeded multi-page documents for the docqa env (no data files): invoices, claim forms, shipment
tables and short reports, each with questions whose answers are exact spans of the document."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from esopt.envs.docqa.values import CARRIERS, CITIES, DEPARTMENTS, FILLER, INCIDENTS, ITEMS, SERVICES, STREETS, TITLES, Values

DOC_TYPES = ("invoice", "form", "table", "report")


def _amount_variants(span: str) -> list[str]:
    """The span, plus the bare number without a currency marker."""
    bare = re.sub(r"^(?:\$|EUR |GBP )", "", span)
    return [span] if bare == span else [span, bare]


@dataclass
class QuestionAnswer:
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
    qas: list[QuestionAnswer]


# ----------------------------------------------------------------------------------------------
# Document kinds
# ----------------------------------------------------------------------------------------------


def _filler_block(g: Values, heading: str) -> tuple[str, list[str]]:
    return heading, g.rng.sample(FILLER, 3)


def _invoice(g: Values) -> _Doc:
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
        QuestionAnswer("What is the invoice number?", inv_no, "invoice_number"),
        QuestionAnswer("What is the invoice date?", inv_date, "invoice_date"),
        QuestionAnswer("When is the payment due?", due_date, "due_date"),
        QuestionAnswer("What is the PO number?", po, "po_number"),
        QuestionAnswer("Who is the invoice billed to (contact name)?", contact, "bill_to_contact"),
        QuestionAnswer("What is the customer ID?", cust, "customer_id"),
        QuestionAnswer("Who is the account manager?", manager, "account_manager"),
        QuestionAnswer("What is the total amount due?", g.money(total), "total_due", m(g.money(total))),
        QuestionAnswer("What is the subtotal?", g.money(subtotal), "subtotal", m(g.money(subtotal))),
        QuestionAnswer("How much tax is charged?", g.money(tax), "tax", m(g.money(tax))),
        QuestionAnswer(f"What is the unit price of {name}?", unit, "unit_price", m(unit), anchor=name),
        QuestionAnswer(f"What is the line amount for {name}?", amt, "line_amount", m(amt), anchor=name),
        QuestionAnswer("What is the bank account number for payment?", account, "bank_account"),
    ]
    return _Doc("invoice", f"Invoice from {vendor}", blocks, qas)


def _form(g: Values) -> _Doc:
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
        QuestionAnswer("What is the claim number?", claim_no, "claim_number"),
        QuestionAnswer("What is the policy number?", policy, "policy_number"),
        QuestionAnswer("On what date did the incident happen?", inc_date, "incident_date"),
        QuestionAnswer("On what date was the claim filed?", filed, "date_filed"),
        QuestionAnswer("What is the claimant's name?", claimant, "claimant"),
        QuestionAnswer("What is the claimant's date of birth?", dob, "date_of_birth"),
        QuestionAnswer("What is the claimant's phone number?", phone, "phone"),
        QuestionAnswer("What is the police report number?", police, "police_report"),
        QuestionAnswer("Who is the witness?", witness, "witness"),
        QuestionAnswer("What is the estimated damage?", damage, "estimated_damage", m(damage)),
        QuestionAnswer("Who is the assigned adjuster?", adjuster, "adjuster"),
        QuestionAnswer("What is the adjuster ID?", adjuster_id, "adjuster_id"),
    ]
    return _Doc("form", f"Claim form from {insurer}", blocks, qas)


def _table(g: Values) -> _Doc:
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
        QuestionAnswer(f"What was the cost of shipment {sid}?", cost, "shipment_cost", _amount_variants(cost), sid),
        QuestionAnswer(f"On what date was shipment {sid} sent?", date, "shipment_date", anchor=sid),
        QuestionAnswer(f"What was the weight in kg of shipment {sid}?", weight, "shipment_weight", anchor=sid),
        QuestionAnswer(f"Which carrier handled shipment {sid}?", carrier, "carrier", anchor=sid),
        QuestionAnswer(f"What was the destination of shipment {sid}?", dest, "destination", anchor=sid),
        QuestionAnswer("Who prepared the shipment log?", preparer, "preparer"),
        QuestionAnswer("What is the log ID?", report_id, "log_id"),
    ]
    return _Doc("table", f"Shipment log of {company}", blocks, qas)


def _report(g: Values) -> _Doc:
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
        QuestionAnswer("Who prepared the report?", author, "author"),
        QuestionAnswer("What is the report number?", rpt, "report_number"),
        QuestionAnswer("When was the report issued?", issued, "issued"),
        QuestionAnswer(f"What was the revenue for Q{q}?", revenue, "revenue", m(revenue)),
        QuestionAnswer(f"What was the revenue in Q{q - 1}?", prev, "previous_revenue", m(prev)),
        QuestionAnswer("What budget did the board approve for the next quarter?", budget, "budget", m(budget)),
        QuestionAnswer(f"Who leads project {project}?", lead, "project_lead"),
        QuestionAnswer(f"Who sponsors project {project}?", sponsor, "project_sponsor"),
        QuestionAnswer("When is the next review meeting?", review, "next_review"),
        QuestionAnswer(f"What is the headcount of the {dept} department?", headcount, "headcount"),
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
    g = Values(rng)
    doc = _GENERATORS[kind](g)
    blocks = list(doc.blocks)
    while len(blocks) < n_pages:  # too few sections for the pages asked for: add appendices
        blocks.append(_filler_block(g, f"Appendix {chr(ord('A') + len(blocks) - len(doc.blocks))}"))
    pages, titles = _paginate(blocks, n_pages)
    return {"kind": kind, "title": doc.title, "pages": pages, "page_titles": titles, "qas": doc.qas}
