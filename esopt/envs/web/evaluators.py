"""Evaluators of WebArena's kinds, plus program checks of the built-in site's state.

Evaluation specs use WebArena's task-config `eval` format::

    {"eval_types": ["string_match"], "reference_answers": {"exact_match": "7"}}
    {"eval_types": ["string_match"], "reference_answers": {"must_include": ["12.50", "a |OR| b"]}}
    {"eval_types": ["url_match"], "reference_url": "__SHOPPING__/product/3", "url_note": "GOLD in PRED"}
    {"eval_types": ["program_html"], "program_html": [{"url": "last", "locator": "document.querySelector('#x').outerText",
                                                       "required_contents": {"must_include": ["shipped"]}}]}
    {"eval_types": ["program"], "program": {"check": "order_placed", "product_id": 3, "qty": 2}}

Several eval_types multiply (all must pass). Semantics follow WebArena's evaluation harness:
answers are cleaned (surrounding whitespace and quotes stripped, lower-cased; here also inner
whitespace collapsed and one trailing period dropped); must_include phrases may hold alternatives
separated by " |OR| "; a lone one-character phrase must match a whole word. url_match "GOLD in PRED"
(WebArena's rule) passes when a reference host+path is a substring of the final one and every
reference query value is present; "EXACT" (used by the built-in tasks) needs the same path.
program_html reads the page's DOM: url "last" = the final page, otherwise the URL is opened in a
new tab of the episode's browser context (same cookies); locator "" = the page's HTML, a locator
starting with "document." or "[...document." is evaluated as JavaScript (after any prep_actions).
WebArena's Python helper locators/URLs ("func:...") and LLM-judged fuzzy_match are not available:
a "func:" target fails, and fuzzy_match degrades to must_include of each reference (exact match
for "N/A").
"""

from __future__ import annotations

import html
import re
import urllib.parse

from esopt.envs.web.site.state import ORDER_STATUSES, SiteState

OR = " |OR| "


def clean_answer(text: str) -> str:
    text = re.sub(r"\s+", " ", str(text)).strip()
    for _ in range(2):  # 'x'. and 'x.' both clean to x
        if text.endswith(".") and not text.endswith(".."):
            text = text[:-1].rstrip()
        if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
            text = text[1:-1].strip()
    return text.lower()


def exact_match(ref: str, pred: str) -> bool:
    return clean_answer(pred) == clean_answer(ref)


def must_include(ref: str, pred: str, tokenize: bool = False) -> bool:
    """Every reference phrase must occur in pred; " |OR| " separates acceptable alternatives."""
    clean_pred = clean_answer(pred)
    for alt in str(ref).split(OR):
        r = clean_answer(alt)
        if tokenize and len(r) == 1:
            if r in re.findall(r"\w+|[^\w\s]", clean_pred):
                return True
        elif r in clean_pred:
            return True
    return False


def string_match(reference_answers: dict, answer: str | None) -> tuple[bool, str]:
    pred = answer or ""
    for approach, value in reference_answers.items():
        if approach == "exact_match":
            if not exact_match(str(value), pred):
                return False, f"exact_match {value!r}"
        elif approach in ("must_include", "fuzzy_match"):
            if value == "N/A":
                if not exact_match("N/A", pred):
                    return False, f"{approach} 'N/A'"
                continue
            values = [value] if isinstance(value, str) else list(value)
            for v in values:
                if not must_include(str(v), pred, tokenize=len(values) == 1):
                    return False, f"{approach} {v!r}"
        else:
            return False, f"unsupported reference_answers key {approach!r}"
    return True, ""


def _split_url(url: str) -> tuple[str, dict[str, list[str]]]:
    u = urllib.parse.urlsplit(str(url).strip())
    return (u.netloc + u.path).rstrip("/"), urllib.parse.parse_qs(u.query)


def url_match(reference_url: str, page_url: str, url_note: str = "GOLD in PRED") -> tuple[bool, str]:
    refs = [r.strip() for r in str(reference_url).split(OR) if r.strip()]
    pred_base, pred_query = _split_url(page_url)
    note = (url_note or "GOLD in PRED").upper()
    if note not in ("GOLD IN PRED", "EXACT"):
        return False, f"unknown url_note {url_note!r}"
    ref_parts = [_split_url(r) for r in refs]
    if note == "EXACT":
        base_ok = any(base == pred_base for base, _ in ref_parts)
    else:
        base_ok = any(base in pred_base for base, _ in ref_parts)
    if not base_ok:
        return False, f"url {page_url!r} does not match {reference_url!r}"
    wanted: dict[str, set[str]] = {}
    for _, query in ref_parts:
        for k, vs in query.items():
            wanted.setdefault(k, set()).update(vs)
    for k, vs in wanted.items():
        if not any(v in pred_query.get(k, []) for v in vs):
            return False, f"query {k}={sorted(vs)} missing from {page_url!r}"
    return True, ""


def program_html(page, targets: list, resolve_url) -> tuple[bool, str]:
    """WebArena's program_html check, run in the episode's browser (`page` = its final page)."""
    for target in targets:
        url = str(target.get("url", "last"))
        locator = str(target.get("locator", ""))
        if url.startswith("func:") or locator.startswith("func:"):
            return False, "program_html 'func:' helpers are not supported"
        tab = page
        try:
            if url != "last":
                tab = page.context.new_page()
                tab.goto(resolve_url(url))
            if not locator.strip():
                selected = tab.content()
            elif locator.startswith(("document.", "[...document.")):
                for prep in target.get("prep_actions", []) or []:
                    try:
                        tab.evaluate(f"() => {prep}")
                    except Exception:
                        pass
                try:
                    selected = str(tab.evaluate(f"() => {locator}") or "")
                except Exception:
                    selected = ""
            else:
                return False, f"unknown locator {locator[:60]!r}"
        except Exception as e:
            return False, f"program_html could not open {url!r}: {str(e).splitlines()[0][:120]}"
        finally:
            if tab is not page:
                try:
                    tab.close()
                except Exception:
                    pass
        selected = html.unescape(selected)
        required = target.get("required_contents", {})
        if "exact_match" in required:
            if not exact_match(str(required["exact_match"]), selected):
                return False, f"program_html exact_match {required['exact_match']!r}"
        elif "must_include" in required:
            for phrase in required["must_include"]:
                if not must_include(str(phrase), selected):
                    return False, f"program_html must_include {phrase!r}"
        else:
            return False, f"unknown required_contents {sorted(required)}"
    return True, ""


def _same_text(a: str, b: str) -> bool:
    return clean_answer(a) == clean_answer(b)


def program_check(state: SiteState | None, spec: dict) -> tuple[bool, str]:
    """A check of the built-in site's final state (what WebArena does with DB queries/helpers)."""
    if state is None:
        return False, "program checks need the built-in site"
    check = spec.get("check")
    if check == "order_placed":
        for o in state.new_orders():
            if o.customer == state.user and any(
                i.product_id == spec["product_id"] and i.qty == spec["qty"] for i in o.items
            ):
                return True, ""
        return False, "no new order with that product and quantity"
    if check == "post_created":
        for t, p in state.new_posts():
            if t.id == spec["thread_id"] and p.author == state.user and _same_text(p.body, spec["text"]):
                return True, ""
        return False, "no such reply in the thread"
    if check == "thread_created":
        for t in state.new_threads():
            if _same_text(t.title, spec["title"]) and _same_text(t.posts[0].body, spec["text"]):
                return True, ""
        return False, "no such thread"
    if check == "price_set":
        p = state.products.get(spec["product_id"])
        ok = p is not None and abs(p.price - float(spec["price"])) < 0.005
        return ok, "" if ok else "price not changed as asked"
    if check == "stock_set":
        p = state.products.get(spec["product_id"])
        ok = p is not None and p.stock == int(spec["stock"])
        return ok, "" if ok else "stock not changed as asked"
    if check == "order_status":
        o = state.orders.get(spec["order_id"])
        ok = o is not None and o.status == spec["status"] and spec["status"] in ORDER_STATUSES
        return ok, "" if ok else "order status not changed as asked"
    return False, f"unknown program check {check!r}"


def evaluator_kind(spec: dict) -> str:
    """A short name of what `spec` checks: exact_match, must_include, url_match, program, program_html
    (joined with '+' when several)."""
    kinds = []
    for t in spec.get("eval_types", []):
        if t == "string_match":
            kinds.extend(k for k in spec.get("reference_answers", {}) if k not in kinds)
        elif t not in kinds:
            kinds.append(t)
    return "+".join(kinds) or "none"
