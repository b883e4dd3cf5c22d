"""The `web` env: tasks, actions, evaluators, and episodes driven through real headless Chromium."""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request

import pytest

from esopt.confutil import ConfigError
from esopt.envs import env_names, make_env
from esopt.envs.web import ACTION_REGEX, TEMPLATES, WebEnv, parse_action
from esopt.envs.web.browser import find_chromium, playwright_available
from esopt.envs.web.evaluators import exact_match, must_include, string_match, url_match
from esopt.envs.web.oracle import Oracle
from esopt.envs.web.site.state import generate_site
from esopt.envs.web.tasks import builtin_tasks, load_task_file, site_split

_CHROMIUM = find_chromium(None)
browser = pytest.mark.browser
needs_browser = pytest.mark.skipif(
    not playwright_available() or not _CHROMIUM or not os.path.exists(_CHROMIUM),
    reason="the web env's browser tests need the playwright package and Chromium (/usr/bin/chromium)",
)


@pytest.fixture(scope="module")
def env():
    e = make_env("web", {})
    yield e
    e.close()


def run(env, task, policy, max_steps=None):
    """Step an episode with `policy(observation) -> action`; returns (episode, results)."""
    ep = env.start(task)
    obs, results = ep.observation, []
    for _ in range(max_steps or env.max_turns):
        r = ep.step(policy(obs))
        results.append(r)
        obs = r.observation
        if r.done:
            break
    return ep, results


# -- no browser needed ---------------------------------------------------------------------


def test_registered():
    assert "web" in env_names()
    assert isinstance(make_env("web", {"max_turns": 5}), WebEnv)
    with pytest.raises(ConfigError):
        make_env("web", {"no_such_key": 1})
    with pytest.raises(ConfigError):
        make_env("web", {"templates": ["nope"]})
    with pytest.raises(ConfigError):
        make_env("web", {"max_turns": 0})
    with pytest.raises(ConfigError):
        make_env("web", {"site_url": "ftp://x"})


def test_tasks_are_prefix_stable_and_split_by_site():  # the protocol itself: test_env_contract.py
    e = make_env("web", {})
    a = e.tasks("train", 24, seed=3)
    assert a[:10] == e.tasks("train", 10, seed=3)
    train = e.tasks("train", 80, 0) + e.tasks("train", 80, 1)
    evals = e.tasks("eval", 80, 0) + e.tasks("eval", 80, 1)
    assert not {t.id for t in train} & {t.id for t in evals}
    assert not {t.data["site_seed"] for t in train} & {t.data["site_seed"] for t in evals}
    assert all(site_split(t.data["site_seed"]) == "train" for t in train)
    assert all(site_split(t.data["site_seed"]) == "eval" for t in evals)
    assert {t.data["category"] for t in a} == {"shop", "forum", "admin"}
    assert {t.data["evaluator"] for t in a} == {"exact_match", "must_include", "url_match", "program"}


def test_category_filter_and_site_determinism():
    e = make_env("web", {"categories": ["forum"]})
    assert {t.data["category"] for t in e.tasks("eval", 12, 0)} == {"forum"}
    a, b = generate_site(7), generate_site(7)
    assert [(p.name, p.price, p.stock) for p in a.products.values()] == [
        (p.name, p.price, p.stock) for p in b.products.values()
    ]
    assert any(p.stock == 0 for p in a.products.values())


def test_parse_action_and_regex():
    ok = {
        "click [12]": ("click", 12, ""),
        "type [3] [blue mug]": ("type", 3, "blue mug"),
        "type [3] [blue mug] [0]": ("type", 3, "blue mug"),
        "select [9] [shipped]": ("select", 9, "shipped"),
        "scroll [down]": ("scroll", None, "down"),
        "go_back": ("go_back", None, ""),
        "goto [/shop/cart]": ("goto", None, "/shop/cart"),
        "stop [12.50]": ("stop", None, "12.50"),
        "stop []": ("stop", None, ""),
    }
    for text, (kind, element, arg) in ok.items():
        a = parse_action(text)
        assert (a.kind, a.element, a.text) == (kind, element, arg), text
        assert re.fullmatch(ACTION_REGEX, text), text
        assert str(a) == text or text == "type [3] [blue mug]"
    assert parse_action("type [3] [1] [1]").enter is True
    assert parse_action("type [3] [1]").enter is None and parse_action("type [3] [1]").text == "1"
    assert parse_action("In summary, the next action is ```click [4]```").element == 4
    assert parse_action("  CLICK [4] ").kind == "click"
    for bad in ["", "click", "click [x]", "type [3]", "hover [3]", "select [2] []", "blah blah", None]:
        assert isinstance(parse_action(bad), str), bad
    for bad in ["click [x]", "click 3", "scroll [left]", "type [3] [a] [2]", "stop", "goto [a b]"]:
        assert not re.fullmatch(ACTION_REGEX, bad), bad


def test_string_and_url_evaluators():
    assert exact_match("Blue Mug", ' "blue  mug". ')
    assert not exact_match("7", "17")
    assert must_include("12.50", "It costs $12.50")
    assert must_include("cat |OR| dog", "a dog")
    assert not must_include("1", "10 items", tokenize=True) and must_include("1", "just 1 item", tokenize=True)
    assert string_match({"must_include": ["alice", "bob"]}, "Bob and Alice")[0]
    assert not string_match({"exact_match": "7"}, None)[0]
    assert string_match({"fuzzy_match": "N/A"}, "N/A")[0]
    assert url_match("http://h/shop/product/1", "http://h/shop/product/12")[0]  # WebArena's substring rule
    assert not url_match("http://h/shop/product/1", "http://h/shop/product/12", "EXACT")[0]
    assert url_match("http://h/shop/product/1", "http://h/shop/product/1/", "EXACT")[0]
    assert url_match("http://h/shop?q=mug", "http://h/shop?q=mug&x=1")[0]
    assert not url_match("http://h/shop?q=mug", "http://h/shop?q=cup")[0]
    assert url_match("http://h/a |OR| http://h/b", "http://h/b")[0]


def test_task_file_validation(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps([{"intent": "x", "start_url": "__SHOPPING__", "eval": {"eval_types": ["llm"]}}]))
    with pytest.raises(ConfigError, match="unsupported eval_type"):
        load_task_file(str(p), 20)
    p.write_text("not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_task_file(str(p), 20)
    with pytest.raises(ConfigError, match="cannot read"):
        load_task_file(str(tmp_path / "missing.json"), 20)


def test_external_site_url_resolution():
    e = make_env("web", {"site_url": "http://127.0.0.1:9", "site_urls": {"REDDIT": "http://127.0.0.1:8/"}})
    assert e.resolve_url("__SHOPPING__/x") == "http://127.0.0.1:9/x"
    assert e.resolve_url("__REDDIT__/f/1") == "http://127.0.0.1:8/f/1"
    assert e.resolve_url("/cart") == "http://127.0.0.1:9/cart"
    assert e.allowed_origins() == {"http://127.0.0.1:9", "http://127.0.0.1:8"}
    with pytest.raises(ConfigError):
        e.tasks("train", 1, 0)  # an external site needs a task file
    e.close()


# -- through the browser -------------------------------------------------------------------

# one template per (category, evaluator kind)
_COVER = {
    ("shop", "exact_match"): "shop_stock",
    ("shop", "must_include"): "shop_price",
    ("shop", "url_match"): "shop_open_product",
    ("shop", "program"): "shop_buy",
    ("forum", "exact_match"): "forum_author",
    ("forum", "must_include"): "forum_repliers",
    ("forum", "url_match"): "forum_open_thread",
    ("forum", "program"): "forum_reply",
    ("admin", "exact_match"): "admin_order_customer",
    ("admin", "must_include"): "admin_out_of_stock",
    ("admin", "url_match"): "admin_open_order",
    ("admin", "program"): "admin_order_status",
}


def test_cover_table_matches_templates():
    for (category, kind), name in _COVER.items():
        task = builtin_tasks("train", 1, 0, [name])[0]
        assert (task.data["category"], task.data["evaluator"]) == (category, kind)
    assert set(_COVER.values()) <= set(TEMPLATES)


@browser
@needs_browser
@pytest.mark.parametrize("key", sorted(_COVER), ids=lambda k: f"{k[0]}-{k[1]}")
def test_oracle_succeeds(env, key):
    task = builtin_tasks("eval", 1, 11, [_COVER[key]])[0]
    ep, results = run(env, task, Oracle(task))
    last = results[-1]
    assert last.done and last.reward == 1.0, last.observation
    assert last.info["success"] is True
    assert (last.info["category"], last.info["evaluator"]) == key
    assert not any(r.info["invalid"] for r in results)
    assert sum(r.reward for r in results) == 1.0
    assert ep.closed and not env._res.server.sessions.get(ep._sid)


@browser
@needs_browser
def test_more_templates_solvable(env):
    rest = [t for t in TEMPLATES if t not in _COVER.values()]
    for name in rest:
        task = builtin_tasks("train", 1, 5, [name])[0]
        _, results = run(env, task, Oracle(task))
        assert results[-1].reward == 1.0, (name, results[-1].observation)


@browser
@needs_browser
def test_observation_is_compact_and_numbered(env):
    task = builtin_tasks("train", 1, 0, ["shop_price"])[0]
    ep = env.start(task)
    obs = ep.observation
    assert obs.startswith(f"OBJECTIVE: {task.data['intent']}")
    assert "PAGE: Shop (/shop)" in obs
    assert re.search(r'\[\d+\] textbox "Search"', obs) and re.search(r'\[\d+\] button "Search"', obs)
    assert len(obs) < env.config.max_obs_chars + 400
    ep.close()


@browser
@needs_browser
def test_garbage_and_wrong_actions_score_zero(env):
    task = builtin_tasks("train", 1, 2, ["shop_buy"])[0]
    garbage = ["", "hello", "click [999]", "type [1] [x]", "select [1] [x]", "click [", "goto [http://10.0.0.1/]",
               "goto [javascript:alert(1)]", "scroll [left]", "type [abc] [x]", "\x00\x01", "stop"]
    it = iter(garbage)
    _, results = run(env, task, lambda obs: next(it))
    assert len(results) == env.max_turns and results[-1].done
    assert sum(r.reward for r in results) == 0.0
    assert results[-1].info["success"] is False
    assert all(r.info["invalid"] for r in results[:-1])
    # a wrong answer scores 0 too, and stepping a finished episode does not raise
    q = builtin_tasks("train", 1, 2, ["shop_stock"])[0]
    ep, results = run(env, q, lambda obs: "stop [-1]")
    assert len(results) == 1 and results[0].done and results[0].reward == 0.0
    assert ep.step("click [1]").done


@browser
@needs_browser
def test_state_resets_between_episodes(env):
    task = builtin_tasks("train", 1, 4, ["shop_buy"])[0]
    ep1 = env.start(task)
    first = ep1.observation
    oracle, obs = Oracle(task), first
    while not ep1.done:
        r = ep1.step(oracle(obs))
        obs = r.observation
    assert r.reward == 1.0
    assert ep1.state.new_orders()  # the order exists in that episode's state
    stock = {p.id: p.stock for p in ep1.state.products.values()}
    ep2 = env.start(task)
    assert not ep2.state.new_orders() and not ep2.state.cart
    assert {p.id: p.stock for p in ep2.state.products.values()} != stock
    assert ep2.observation == first
    r = ep2.step("goto [/shop/orders]")
    assert str(ep1.state.new_orders()[0].id) not in r.observation
    ep2.close()


@browser
@needs_browser
def test_concurrent_episodes_are_isolated(env):
    task = builtin_tasks("train", 1, 6, ["shop_buy"])[0]
    eps = [env.start(task) for _ in range(3)]
    oracles = [Oracle(task) for _ in eps]
    obs = [e.observation for e in eps]
    # round-robin, as the rollout loop does; episode 2 only idles (scrolls)
    done = [False] * 3
    while not all(done[:2]):
        for i in range(2):
            if not done[i]:
                r = eps[i].step(oracles[i](obs[i]))
                obs[i], done[i] = r.observation, r.done
                assert not r.done or r.reward == 1.0
        eps[2].step("scroll [down]")
    assert len(eps[0].state.new_orders()) == 1 and len(eps[1].state.new_orders()) == 1
    assert not eps[2].state.new_orders()
    r = eps[2].step("goto [/shop/cart]")
    assert "Your cart is empty" in r.observation
    eps[2].close()


@browser
@needs_browser
def test_webarena_task_file(tmp_path):
    site = generate_site(0)
    p = next(p for p in site.products.values() if p.stock > 0)
    mine = next(o for o in site.orders.values() if o.customer == site.user and o.status != "cancelled")
    tasks = [
        {"task_id": 1, "sites": ["shopping"], "split": "train", "intent": f"How much is the {p.name}?",
         "start_url": "__SHOPPING__", "require_login": True,
         "eval": {"eval_types": ["string_match"], "reference_answers": {"exact_match": f"${p.price:.2f}"},
                  "reference_url": "", "program_html": []}},
        {"task_id": 2, "sites": ["shopping"], "split": "train", "intent": f"Open my order #{mine.id}.",
         "start_url": "__SHOPPING__/orders",
         "eval": {"eval_types": ["url_match"], "reference_url": f"__SHOPPING__/orders/{mine.id}",
                  "url_note": "GOLD in PRED", "reference_answers": None, "program_html": []}},
        {"task_id": 3, "sites": ["shopping_admin"], "split": "eval", "intent": f"Set order #{mine.id} to cancelled.",
         "start_url": f"__SHOPPING_ADMIN__/order/{mine.id}",
         "eval": {"eval_types": ["program_html"], "reference_answers": None, "reference_url": "",
                  "program_html": [{"url": f"__SHOPPING__/orders/{mine.id}",
                                    "locator": "document.querySelector('#status').outerText",
                                    "required_contents": {"exact_match": "cancelled"}},
                                   {"url": "last", "locator": "",
                                    "required_contents": {"must_include": ["Status updated |OR| saved"]}}]}},
    ]
    path = tmp_path / "webarena.json"
    path.write_text(json.dumps(tasks))
    with make_env("web", {"task_file": str(path)}) as e:
        train, evals = e.tasks("train", 2, 0), e.tasks("eval", 3, 0)
        assert sorted(t.id for t in train) == ["webarena-1", "webarena-2"]
        assert [t.id for t in evals] == ["webarena-3"] * 3
        by_id = {t.id: t for t in train + evals}
        assert by_id["webarena-1"].data["evaluator"] == "exact_match"
        assert by_id["webarena-2"].data["evaluator"] == "url_match"

        def find(obs, role, label):
            return int(re.search(r"\[(\d+)\] " + role + ' "' + re.escape(label) + '"', obs).group(1))

        # string_match: search, open the product, answer
        t = by_id["webarena-1"]
        steps = [lambda o: f"type [{find(o, 'textbox', 'Search')}] [{p.name}]",
                 lambda o: f"click [{find(o, 'link', p.name)}]", lambda o: f"stop [${p.price:.2f}]"]
        it = iter(steps)
        _, results = run(e, t, lambda o: next(it)(o))
        assert results[-1].reward == 1.0 and results[-1].info["evaluator"] == "exact_match"
        it = iter([lambda o: "stop [$0.01]"])
        _, results = run(e, t, lambda o: next(it)(o))
        assert results[-1].reward == 0.0
        # url_match: click through to the order page
        t = by_id["webarena-2"]
        it = iter([lambda o: f"click [{find(o, 'link', f'#{mine.id}')}]", lambda o: "stop [done]"])
        _, results = run(e, t, lambda o: next(it)(o))
        assert results[-1].reward == 1.0 and results[-1].info["url"] == f"/shop/orders/{mine.id}"
        it = iter([lambda o: "stop [done]"])  # staying on the list page fails
        assert run(e, t, lambda o: next(it)(o))[1][-1].reward == 0.0
        # program_html: change the status in the admin, checked through the customer's page DOM
        t = by_id["webarena-3"]
        it = iter([lambda o: f"select [{find(o, 'combobox', 'Status')}] [cancelled]",
                   lambda o: f"click [{find(o, 'button', 'Update status')}]", lambda o: "stop [done]"])
        _, results = run(e, t, lambda o: next(it)(o))
        assert results[-1].reward == 1.0, results[-1].info
        assert results[-1].info["evaluator"] == "program_html"
        assert run(e, t, lambda o: "stop [done]")[1][-1].reward == 0.0  # a fresh state: not cancelled


@browser
@needs_browser
def test_close_releases_everything():
    e = make_env("web", {})
    task = e.tasks("train", 1, 0)[0]
    ep = e.start(task)
    base = e.base_url()
    e.close()
    assert ep.closed and not e._res.browser.started
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(base, timeout=2)
    e.close()  # idempotent
