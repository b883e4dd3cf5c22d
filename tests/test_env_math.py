"""math env: tasks, protocol, oracle/garbage policies, rewards; plus the shared tool parsing and calculator."""

import pytest

from esopt.confutil import ConfigError
from esopt.envs import make_env
from esopt.envs.math import check_answer
from esopt.envs.splits import hash_split
from esopt.envs.tools.actions import ANSWER, INVALID, TOOL, parse_action, parse_number
from esopt.envs.tools.calculator import calculate


@pytest.fixture(scope="module")
def env():
    return make_env("math", {"python_timeout_s": 2.0})


@pytest.fixture(scope="module")
def train_tasks(env):
    return env.tasks("train", 10, 0)


# -- tools: parsing and calculator -------------------------------------------------------------


@pytest.mark.parametrize(
    "reply,kind,tool,arg",
    [
        ("answer: 42", ANSWER, None, "42"),
        ("Let me think.\nFinal answer: 42.", ANSWER, None, "42"),
        ("**Answer:** $42$", ANSWER, None, "42"),
        ("So the result is \\boxed{1,234}.", ANSWER, None, "1,234"),
        ("<answer>7</answer>", ANSWER, None, "7"),
        ("The answer is 17", ANSWER, None, "17"),
        ("calculator: 12*(3+4)", TOOL, "calculator", "12*(3+4)"),
        ("calculator(12*(3+4))", TOOL, "calculator", "12*(3+4)"),
        ("First I add.\nAction: calc: 5+5\nanswer: 10", TOOL, "calculator", "5+5"),
        ("python:\n```python\nprint(6*7)\n```", TOOL, "python", "print(6*7)"),
        ("```python\nprint(5)\n```", TOOL, "python", "print(5)"),
        ("python: print(3)\nanswer: 3", TOOL, "python", "print(3)"),
        ("", INVALID, None, ""),
        ("   \n ", INVALID, None, ""),
        ("blah blah", INVALID, None, ""),
        ("Calculators are useful", INVALID, None, ""),
    ],
)
def test_parse_action(reply, kind, tool, arg):
    act = parse_action(reply, ["calculator", "python"])
    assert act.kind == kind
    assert act.tool == tool
    assert act.arg == arg


def test_parse_action_never_raises_on_junk():
    for junk in [None, 123, "\x00" * 10, "{" * 5000, "answer:" * 3000, "\\boxed{" * 1000, "```" * 999,
                 "answer" + " " * 19000 + "x", "calculator" + " \t" * 9000 + "x"]:
        act = parse_action(junk, ["calculator", "python"])
        assert act.kind in (ANSWER, TOOL, INVALID)


@pytest.mark.parametrize(
    "expr,out",
    [
        ("12*(3+4)", "84"),
        ("2^10", "1024"),
        ("7 // 2", "3"),
        ("7 % 4", "3"),
        ("1/4", "0.25"),
        ("0.1 + 0.2", "0.3"),
        ("sqrt(16) + abs(-2)", "6"),
        ("-3 ** 2", "-9"),
        ("1,000 + 1", "1001"),
        ("3*4 =", "12"),
    ],
)
def test_calculator_values(expr, out):
    assert calculate(expr) == out


@pytest.mark.parametrize(
    "expr",
    ["__import__('os').system('ls')", "x + 1", "9**9**9**9", "2**100000", "10**5000", "(1+2", "1/0",
     "'a' * 3", "[1] * 10", "open('f')", "lambda: 1", "(" * 400 + "1" + ")" * 400, "factorial(100000)"],
)
def test_calculator_rejects_safely(expr):
    assert calculate(expr).startswith("error:")


def test_parse_number():
    assert parse_number("1,234") == 1234
    assert parse_number("$12.50") == pytest.approx(12.5)
    assert parse_number("x = 13") == 13
    assert parse_number("42 apples") == 42
    assert parse_number("3/4") == pytest.approx(0.75)
    assert parse_number("forty") is None


def test_hash_split_is_stable():
    assert hash_split("math", "What is 2+2?") == hash_split("math", "What is 2+2?")
    assert {hash_split("math", f"q{i}") for i in range(50)} == {"train", "val", "eval"}


# -- tasks -------------------------------------------------------------------------------------


def test_splits_are_disjoint_by_question(env):  # the per-seed determinism: test_env_contract.py
    train = {t.data["question"] for s in range(3) for t in env.tasks("train", 30, s)}
    evals = {t.data["question"] for s in range(3) for t in env.tasks("eval", 30, s)}
    assert train and evals and not (train & evals)
    assert len({t.id for t in env.tasks("eval", 30, 0)}) == 30  # de-duplicated
    gens = {t.data["generator"] for t in env.tasks("train", 30, 0)}
    assert gens == {"basic_arithmetic", "gsm_symbolic", "simple_equations"}


def test_config_errors():
    with pytest.raises(ConfigError, match="math.generators"):
        make_env("math", {"generators": ["no_such_generator"]})
    with pytest.raises(ConfigError, match="math.generator_options.basic_arithmetic"):
        make_env("math", {"generator_options": {"basic_arithmetic": {"min_terms": 0}}})
    with pytest.raises(ConfigError, match="math.generator_options.basic_arithmetic"):
        make_env("math", {"generator_options": {"basic_arithmetic": {"bogus": 1}}})
    with pytest.raises(ConfigError, match="math.tools"):
        make_env("math", {"tools": ["shell"]})
    with pytest.raises(ConfigError, match="math.max_turns"):
        make_env("math", {"max_turns": 0})
    with pytest.raises(ConfigError, match="math.weights"):
        make_env("math", {"weights": [1.0]})


def test_generator_options_pass_through():
    env = make_env("math", {"generators": ["basic_arithmetic"],
                            "generator_options": {"basic_arithmetic": {"min_terms": 2, "max_terms": 2,
                                                                       "max_digits": 1}}})
    for t in env.tasks("train", 10, 0):
        assert t.data["entry"]["metadata"]["num_terms"] == 2


# -- episodes ----------------------------------------------------------------------------------


def _oracle_episode(env, task, style):
    ep = env.start(task)
    gold = task.data["answer"]
    meta = task.data["entry"]["metadata"]
    results = []
    if style == "calculator" and "expression" in meta:
        r = ep.step(f"calculator: {meta['expression']}")
        assert r.info["tool_ok"] and r.observation.startswith(f"calculator: {gold}"), r.observation
        results.append(r)
    elif style == "python":
        r = ep.step(f"python:\n```python\nprint({gold!r})\n```")
        assert r.info["tool_ok"] and gold in r.observation, r.observation
        results.append(r)
    results.append(ep.step(f"answer: {gold}"))
    return results


def test_oracle_reaches_reward_1(env, train_tasks):
    assert len(train_tasks) == 10
    for i, task in enumerate(train_tasks):
        style = "python" if i == 0 else ("calculator" if i % 2 else "direct")
        results = _oracle_episode(env, task, style)
        last = results[-1]
        assert last.done and last.reward == 1.0 and last.info["success"] is True
        assert last.info["answer"] == task.data["answer"]
        assert sum(r.reward for r in results) == 1.0


def test_answer_variants_accepted(env, train_tasks):
    task = next(t for t in train_tasks if t.data["generator"] != "simple_equations")
    gold = task.data["answer"]
    for reply in [f"Final answer: {gold}", f"I get \\boxed{{{gold}}}", f"The answer is {gold}.",
                  f"**Answer:** {gold}"]:
        r = env.start(task).step(reply)
        assert r.done and r.reward == 1.0, reply


def test_check_answer_forgiving():
    entry = {"question": "q", "answer": "288", "metadata": {}}
    assert check_answer("288", entry)
    assert check_answer("288.0", entry)
    assert check_answer("288 apples", entry)
    assert check_answer("12*24", entry)  # math-verify
    assert not check_answer("289", entry)
    assert not check_answer("", entry)
    assert not check_answer("9^9^9^9", entry)
    assert check_answer("0.5", {"answer": "1/2"})


def test_garbage_policies_get_zero_without_raising(env, train_tasks):
    task = train_tasks[1]
    policies = [
        ["", "", "", ""],
        ["asdf qwerty", "???", "calculator:", "python:"],
        ["calculator: __import__('os').system('echo hi')", "calculator: 9**9**9**9", "calculator: 1/0", "zzz"],
        ["answer:", "answer:   ", "<answer></answer>", "\\boxed{}"],
        [None, 12, "\x00\x01", "{" * 10000],
    ]
    for actions in policies:
        ep = env.start(task)
        total = 0.0
        for a in actions:
            r = ep.step(a)
            total += r.reward
            assert r.info["invalid"] or "tool" in r.info
            if r.done:
                break
        assert r.done and total == 0.0 and r.info["success"] is False and r.info["answer"] is None
        after = ep.step("answer: 1")
        assert after.done and after.reward == 0.0 and after.info["invalid"]


def test_hostile_python_is_contained(train_tasks):
    env = make_env("math", {"python_timeout_s": 1.0, "max_turns": 3})
    ep = env.start(train_tasks[2])
    r = ep.step("python:\n```python\nwhile True:\n    pass\n```")
    assert not r.done and r.info["tool_ok"] is False and "timeout" in r.observation
    r = ep.step("python:\n```python\nimport os\nos.system('echo hacked')\n```")
    assert not r.done and r.info["tool_ok"] is False and "blocked" in r.observation
    r = ep.step("python:\n```python\nprint('x' * 10**6)\n```")
    assert r.done and r.reward == 0.0 and len(r.observation) < 2000


def test_wrong_answer_and_reward_terms(train_tasks):
    task = train_tasks[3]
    gold = task.data["answer"]
    wrong = str(int(float(gold)) + 1) if "." not in gold else gold + "1"
    env = make_env("math", {"format_reward": 0.1, "tool_reward": 0.2, "tools": ["calculator"]})
    r = env.start(task).step(f"answer: {wrong}")
    assert r.done and r.reward == pytest.approx(0.1) and r.info["success"] is False
    ep = env.start(task)
    ep.step("calculator: 1+1")
    r = ep.step(f"answer: {gold}")
    assert r.reward == pytest.approx(1.3) and r.info["tool_calls"] == 1
    # loose answer text: correct but not a well-formed answer line -> no format bonus
    r = env.start(task).step(f"So I think the answer is {gold}")
    assert r.reward == pytest.approx(1.0)
    # a failed tool call earns no tool bonus
    ep = env.start(task)
    ep.step("calculator: 1/0")
    assert ep.step(f"answer: {gold}").reward == pytest.approx(1.1)
    # defaults: no bonuses, wrong answer -> 0
    assert make_env("math").start(task).step(f"answer: {wrong}").reward == 0.0


def test_tool_call_budget_and_turn_limit(train_tasks):
    env = make_env("math", {"max_tool_calls": 1, "max_turns": 3, "tools": ["calculator"]})
    ep = env.start(train_tasks[4])
    r1 = ep.step("calculator: 2+2")
    assert r1.info["tool_ok"] and not r1.info["invalid"]
    r2 = ep.step("calculator: 3+3")
    assert r2.info["invalid"] and "No tool calls left" in r2.observation
    r3 = ep.step("calculator: 4+4")
    assert r3.done and r3.reward == 0.0 and r3.info["success"] is False and r3.info["tool_calls"] == 1
    # python disabled: a python call is not an action
    r = make_env("math", {"tools": ["calculator"]}).start(train_tasks[4]).step("python: print(1)")
    assert r.info["invalid"]


def test_prompts_mention_protocol(env, train_tasks):
    assert "calculator:" in env.system_prompt and "answer:" in env.system_prompt
    obs = env.start(train_tasks[0]).observation
    assert train_tasks[0].data["question"].strip() in obs and "answer:" in obs
    assert env.action_regex is None and env.max_turns == 4
