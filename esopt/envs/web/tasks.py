"""Task templates of the built-in site, task generation, and the WebArena task-file loader.

A built-in task is generated from (template, site_seed): the site's data comes from the seed, and
the template picks a product / thread / order of that site and writes the objective, the start URL
and a WebArena-format `eval` spec. Each template also yields a reference solution (`Plan`), a list
of abstract steps that `oracle.py` turns into actions by reading the observations; it is never put
in the task data.

The split is decided by the site seed (one seed in five is an eval site), so train and eval tasks
are always on different site instances and can never coincide.

Task.data keys: source ("builtin" | "webarena"), template, category, evaluator, intent, start_url
(placeholders such as __SITE__ or __SHOPPING__ are resolved at episode start), eval, and
site_seed (built-in site) / storage_state (task files, optional).
"""

from __future__ import annotations

import json
import os
import random
from typing import Callable

from esopt.confutil import ConfigError
from esopt.envs.base import SPLITS, Task, held_out_split
from esopt.envs.splits import short_hash, stable_int
from esopt.envs.web.evaluators import evaluator_kind
from esopt.envs.web.site.state import CATEGORIES, NOUNS, ORDER_STATUSES, REPLY_WORDS, THREAD_OPENERS, SiteState, generate_site

# A plan step: ("click", role, label) | ("type", role, label, text, enter) |
# ("select", role, label, option) | ("goto", path) | ("stop", answer)
Plan = list[tuple]
Spec = dict
Template = Callable[[SiteState, random.Random], "tuple[Spec, Plan] | None"]

EVAL_ONE_IN = 5  # one site seed in EVAL_ONE_IN is an eval site
SITE = "__SITE__"


def site_split(site_seed: int) -> str:
    if stable_int(f"esopt-web-split|{site_seed}") % EVAL_ONE_IN:
        return "train"
    return held_out_split(f"web-site|{site_seed}")


def _answer(kind: str, value) -> dict:
    return {"eval_types": ["string_match"], "reference_answers": {kind: value}}


def _url(path: str) -> dict:
    return {"eval_types": ["url_match"], "reference_url": SITE + path, "url_note": "EXACT"}


def _program(**check) -> dict:
    return {"eval_types": ["program"], "program": check}


def _spec(intent: str, start: str, ev: dict) -> Spec:
    return {"intent": intent, "start_url": SITE + start, "eval": ev}


def _search_product(name: str) -> Plan:
    return [("type", "textbox", "Search", name, True), ("click", "link", name)]


# -- shop --------------------------------------------------------------------------------------


def shop_price(s: SiteState, rng: random.Random):
    p = rng.choice(list(s.products.values()))
    return (_spec(f"What is the price of the {p.name}?", "/shop", _answer("must_include", [f"{p.price:.2f}"])),
            _search_product(p.name) + [("stop", f"${p.price:.2f}")])


def shop_stock(s: SiteState, rng: random.Random):
    p = rng.choice([p for p in s.products.values() if p.stock > 0])
    return (_spec(f"How many {p.name} are in stock? Answer with a number.", "/shop",
                  _answer("exact_match", str(p.stock))),
            [("click", "link", p.name), ("stop", str(p.stock))])


def shop_open_product(s: SiteState, rng: random.Random):
    p = rng.choice(list(s.products.values()))
    return (_spec(f"Open the product page of the {p.name}.", "/shop", _url(f"/shop/product/{p.id}")),
            _search_product(p.name) + [("stop", "")])


def shop_buy(s: SiteState, rng: random.Random):
    p = rng.choice([p for p in s.products.values() if p.stock > 0])
    qty = rng.randint(1, min(3, p.stock))
    what = f"one {p.name}" if qty == 1 else f"{qty} {p.name}"
    return (_spec(f"Buy {what}.", "/shop", _program(check="order_placed", product_id=p.id, qty=qty)),
            [("click", "link", p.name), ("type", "textbox", "Quantity", str(qty), False),
             ("click", "button", "Add to cart"), ("click", "link", "Checkout"),
             ("click", "button", "Place order"), ("stop", "")])


def shop_order_status(s: SiteState, rng: random.Random):
    o = rng.choice([o for o in s.orders.values() if o.customer == s.user])
    return (_spec(f"What is the status of my order #{o.id}?", "/shop", _answer("exact_match", o.status)),
            [("click", "link", "My orders"), ("click", "link", f"#{o.id}"), ("stop", o.status)])


def shop_cheapest(s: SiteState, rng: random.Random):
    cat = rng.choice(CATEGORIES)
    items = sorted((p for p in s.products.values() if p.category == cat), key=lambda p: p.price)
    if len(items) > 1 and items[0].price == items[1].price:
        return None
    return (_spec(f"Which {cat} product is the cheapest? Answer with its name.", "/shop",
                  _answer("exact_match", items[0].name)),
            [("click", "link", cat), ("stop", items[0].name)])


# -- forum -------------------------------------------------------------------------------------


def _thread(s: SiteState, rng: random.Random, min_replies: int = 0):
    ts = [t for t in s.threads.values() if len({p.author for p in t.replies}) >= min_replies]
    return rng.choice(ts) if ts else None


def forum_author(s: SiteState, rng: random.Random):
    t = _thread(s, rng)
    return (_spec(f'Who started the forum thread "{t.title}"? Answer with the user name.', "/forum",
                  _answer("exact_match", t.author)),
            [("click", "link", t.title), ("stop", t.author)])


def forum_reply_count(s: SiteState, rng: random.Random):
    t = _thread(s, rng)
    n = len(t.replies)
    return (_spec(f'How many replies does the forum thread "{t.title}" have? Answer with a number.', "/forum",
                  _answer("exact_match", str(n))),
            [("click", "link", t.title), ("stop", str(n))])


def forum_open_thread(s: SiteState, rng: random.Random):
    t = _thread(s, rng)
    return (_spec(f'Open the forum thread "{t.title}".', "/forum", _url(f"/forum/thread/{t.id}")),
            [("click", "link", t.title), ("stop", "")])


def forum_reply(s: SiteState, rng: random.Random):
    t = _thread(s, rng)
    text = f"Mine is {rng.choice(REPLY_WORDS)} too"
    return (_spec(f'Reply "{text}" to the forum thread "{t.title}".', "/forum",
                  _program(check="post_created", thread_id=t.id, text=text)),
            [("click", "link", t.title), ("type", "textbox", "Reply", text, False),
             ("click", "button", "Post reply"), ("stop", "")])


def forum_new_thread(s: SiteState, rng: random.Random):
    nouns = [n.lower() for ns in NOUNS.values() for n in ns]
    title = f"{rng.choice(THREAD_OPENERS)} {rng.choice(nouns)}"
    if s.thread_by_title(title) is not None:
        return None
    text = f"I rate it {rng.randint(2, 9)} stars"
    return (_spec(f'Create a forum thread titled "{title}" with the text "{text}".', "/forum",
                  _program(check="thread_created", title=title, text=text)),
            [("click", "link", "New thread"), ("type", "textbox", "Title", title, False),
             ("type", "textbox", "Text", text, False), ("click", "button", "Create thread"), ("stop", "")])


def forum_repliers(s: SiteState, rng: random.Random):
    t = _thread(s, rng, min_replies=2)
    if t is None:
        return None
    names = sorted({p.author for p in t.replies})
    return (_spec(f'Which users replied to the forum thread "{t.title}"? List their names.', "/forum",
                  _answer("must_include", names)),
            [("click", "link", t.title), ("stop", ", ".join(names))])


# -- admin -------------------------------------------------------------------------------------


def admin_set_price(s: SiteState, rng: random.Random):
    p = rng.choice(list(s.products.values()))
    new = p.price
    while new == p.price:
        new = round(rng.randint(3, 89) + rng.choice([0.0, 0.5, 0.99]), 2)
    return (_spec(f"Change the price of the {p.name} to ${new:.2f}.", "/admin",
                  _program(check="price_set", product_id=p.id, price=new)),
            [("click", "link", "Products"), ("click", "link", p.name),
             ("type", "textbox", "Price", f"{new:.2f}", False), ("click", "button", "Save"), ("stop", "")])


def admin_set_stock(s: SiteState, rng: random.Random):
    p = rng.choice(list(s.products.values()))
    new = rng.choice([n for n in range(5, 60, 5) if n != p.stock])
    return (_spec(f"Set the stock of the {p.name} to {new}.", "/admin",
                  _program(check="stock_set", product_id=p.id, stock=new)),
            [("click", "link", "Products"), ("click", "link", p.name),
             ("type", "textbox", "Stock", str(new), False), ("click", "button", "Save"), ("stop", "")])


def admin_order_status(s: SiteState, rng: random.Random):
    o = rng.choice(list(s.orders.values()))
    status = rng.choice([x for x in ORDER_STATUSES if x != o.status])
    return (_spec(f"Set the status of order #{o.id} to {status}.", "/admin",
                  _program(check="order_status", order_id=o.id, status=status)),
            [("click", "link", "Orders"), ("click", "link", f"#{o.id}"),
             ("select", "combobox", "Status", status), ("click", "button", "Update status"), ("stop", "")])


def admin_order_customer(s: SiteState, rng: random.Random):
    o = rng.choice(list(s.orders.values()))
    return (_spec(f"Which customer placed order #{o.id}? Answer with the user name.", "/admin",
                  _answer("exact_match", o.customer)),
            [("click", "link", "Orders"), ("stop", o.customer)])


def admin_open_order(s: SiteState, rng: random.Random):
    o = rng.choice(list(s.orders.values()))
    return (_spec(f"Open the admin page of order #{o.id}.", "/admin", _url(f"/admin/order/{o.id}")),
            [("click", "link", "Orders"), ("click", "link", f"#{o.id}"), ("stop", "")])


def admin_out_of_stock(s: SiteState, rng: random.Random):
    names = [p.name for p in s.products.values() if p.stock == 0]
    if not names:
        return None
    return (_spec("Which products are out of stock? List their names.", "/admin", _answer("must_include", names)),
            [("click", "link", "Products"), ("stop", ", ".join(names))])


TEMPLATES: dict[str, Template] = {
    f.__name__: f
    for f in [
        shop_price, shop_stock, shop_open_product, shop_buy, shop_order_status, shop_cheapest,
        forum_author, forum_reply_count, forum_open_thread, forum_reply, forum_new_thread, forum_repliers,
        admin_set_price, admin_set_stock, admin_order_status, admin_order_customer, admin_open_order,
        admin_out_of_stock,
    ]
}


def template_category(name: str) -> str:
    return name.split("_", 1)[0]


def _instantiate(template: str, site_seed: int) -> tuple[Task, Plan] | None:
    state = generate_site(site_seed)
    made = TEMPLATES[template](state, random.Random(f"esopt-web-task|{template}|{site_seed}"))
    if made is None:
        return None
    spec, plan = made
    data = {
        "source": "builtin",
        "template": template,
        "category": template_category(template),
        "evaluator": evaluator_kind(spec["eval"]),
        "site_seed": site_seed,
        **spec,
    }
    digest = short_hash(json.dumps(data, sort_keys=True), 10)
    return Task(id=f"web-{template}-{digest}", data=data), plan


def builtin_tasks(split: str, n: int, seed: int, templates: list[str]) -> list[Task]:
    """`n` tasks of `split`, cycling through `templates` in a seeded order."""
    rng = random.Random(f"esopt-web-tasks|{split}|{seed}")
    order = rng.sample(templates, len(templates))
    out: list[Task] = []
    seen: set[str] = set()
    for i in range(n):
        template = order[i % len(order)]
        for _ in range(10_000):
            site_seed = rng.randrange(2**31)
            if site_split(site_seed) != split:
                continue
            made = _instantiate(template, site_seed)
            if made is None or made[0].id in seen:
                continue
            seen.add(made[0].id)
            out.append(made[0])
            break
        else:  # pragma: no cover - every template succeeds on most sites
            raise RuntimeError(f"could not generate a {template} task")
    return out


def oracle_plan(task: Task) -> Plan:
    """The reference solution of a built-in task (abstract steps; see `oracle.py`)."""
    if task.data.get("source") != "builtin":
        raise ValueError("only built-in tasks have a reference solution")
    made = _instantiate(task.data["template"], task.data["site_seed"])
    if made is None or made[0].data != task.data:
        raise ValueError(f"task {task.id} does not come from its template")
    return made[1]


# -- WebArena task files -----------------------------------------------------------------------


def load_task_file(path: str, eval_percent: int) -> list[Task]:
    """Tasks from a JSON file of WebArena-format configs (a list of objects, or one object).

    Used keys: task_id, intent, start_url, eval (eval_types, reference_answers, reference_url,
    url_note, program_html), sites (-> category), storage_state (a login-cookie file, relative to
    the task file), site_seed (which built-in site to use when no site_url is set), split ("train"
    or "eval"; without it a task goes to eval when a hash of its task_id falls in `eval_percent`%).
    """
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except OSError as e:
        raise ConfigError(f"env.web.task_file: cannot read {path!r}: {e}") from e
    except json.JSONDecodeError as e:
        raise ConfigError(f"env.web.task_file: {path!r} is not valid JSON: {e}") from e
    items = raw if isinstance(raw, list) else [raw]
    base = os.path.dirname(os.path.abspath(path))
    tasks = []
    for k, item in enumerate(items):
        where = f"env.web.task_file {path!r} task #{k}"
        if not isinstance(item, dict):
            raise ConfigError(f"{where}: expected an object")
        for key in ("intent", "start_url", "eval"):
            if key not in item:
                raise ConfigError(f"{where}: missing {key!r}")
        ev = item["eval"]
        types = ev.get("eval_types")
        if not isinstance(types, list) or not types:
            raise ConfigError(f"{where}: eval.eval_types must be a non-empty list")
        for t in types:
            if t not in ("string_match", "url_match", "program_html", "program"):
                raise ConfigError(f"{where}: unsupported eval_type {t!r}")
        if "string_match" in types and not isinstance(ev.get("reference_answers"), dict):
            raise ConfigError(f"{where}: string_match needs eval.reference_answers")
        if "url_match" in types and not ev.get("reference_url"):
            raise ConfigError(f"{where}: url_match needs eval.reference_url")
        if "program_html" in types and not isinstance(ev.get("program_html"), list):
            raise ConfigError(f"{where}: program_html needs a list eval.program_html")
        task_id = str(item.get("task_id", k))
        split = item.get("split")
        if split is None:
            held_out = stable_int(f"esopt-web-file|{task_id}") % 100 < eval_percent
            split = held_out_split(f"web-file|{task_id}") if held_out else "train"
        elif split not in SPLITS:
            raise ConfigError(f"{where}: split must be one of {', '.join(SPLITS)}, got {split!r}")
        sites = item.get("sites") or ["webarena"]
        data = {
            "source": "webarena",
            "template": str(item.get("intent_template_id", "webarena")),
            "category": "+".join(sites),
            "evaluator": evaluator_kind(ev),
            "intent": item["intent"],
            "start_url": item["start_url"],
            "eval": ev,
            "split": split,
            "task_id": task_id,
        }
        if "site_seed" in item:
            data["site_seed"] = int(item["site_seed"])
        if item.get("storage_state"):
            data["storage_state"] = os.path.join(base, item["storage_state"])
        tasks.append(Task(id=f"webarena-{task_id}", data=data))
    return tasks
