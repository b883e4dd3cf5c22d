"""AHD outer loops (Sample, EoH) and their co-evolution with ES: parsing, operators, selection,
duplicates, the loops on a scripted policy, and co-evolution on the tiny random model."""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
from collections import Counter

import pytest

from esopt.confutil import ConfigError
from esopt.ahd.tasks import get_task
from esopt.es import read_history
from esopt.policy.base import Policy
from esopt.ahd.candidates import Candidate, CandidateEvaluator
from esopt.ahd.config import AHDConfig, EoHConfig
from esopt.ahd.loops import batch_fitness, run_ahd
from esopt.ahd.proposers import EoHProposer
from esopt.ahd.prompts import (
    ExtractionError,
    Parent,
    extract_code,
    extract_thought,
    normalise_code,
    operator_prompt,
    rank_weights,
    select_parents,
)
from esopt.ahd.report import compare_runs, gap_ratio_gain, load_run

NN = '''import numpy as np

def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):
    d = distance_matrix[current_node, unvisited_nodes]
    return int(unvisited_nodes[int(np.argmin(d))])
'''

FIRST = '''def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):
    return int(unvisited_nodes[0])
'''

ILLEGAL = '''def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):
    return -5
'''


# ----------------------------------------------------------------------------------- extraction
def test_extract_fenced_python_block_preferred():
    reply = ("{Pick the nearest node.}\nHere is some text.\n```\nprint('not it')\n```\n"
             f"```python\n{NN}```\nThat is all.")
    code = extract_code(reply, "select_next_node")
    assert "def select_next_node" in code and "print('not it')" not in code
    assert extract_thought(reply) == "Pick the nearest node."


def test_extract_unfenced_and_truncated_and_adds_numpy_import():
    reply = ("Sure! My heuristic:\n\ndef select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):\n"
             "    d = distance_matrix[current_node, unvisited_nodes]\n"
             "    return int(unvisited_nodes[np.argmin(d)])\n\nThis picks the closest node.")
    code = extract_code(reply, "select_next_node")
    assert code.startswith("import numpy as np")
    assert "This picks" not in code
    compile(code, "<c>", "exec")
    truncated = f"```python\n{NN}\ndef helper(x):\n    return (x +"  # cut by max_new_tokens, no closing fence
    code = extract_code(truncated, "select_next_node")
    assert "def select_next_node" in code and "helper" not in code
    compile(code, "<c>", "exec")


@pytest.mark.parametrize("reply, reason", [
    ("", "empty reply"),
    ("I cannot help with that, sorry.", "no Python code"),
    ("```python\ndef other(x):\n    return 1\n```", "does not define a function named 'select_next_node'"),
    ("```python\ndef select_next_node(a, b, c, d)\n    return )\n```", "SyntaxError"),
])
def test_extract_garbage_gives_reason(reply, reason):
    with pytest.raises(ExtractionError, match=reason):
        extract_code(reply, "select_next_node")


def test_normalise_code_ignores_comments_docstrings_and_formatting():
    a = 'def f(x):\n    """doc"""\n    # comment\n    return x+1\n'
    b = "def f(x):\n    return (x + 1)  # other\n"
    assert normalise_code(a) == normalise_code(b)
    assert normalise_code(a) != normalise_code("def f(x):\n    return x + 2\n")


# ----------------------------------------------------------------------------------- operators
def test_eoh_operators_build_prompts_with_parents():
    task = get_task("tsp20")
    p1 = Parent("nearest node first", NN, 4.03)
    p2 = Parent("first unvisited node", FIRST, 10.5)
    args = (task.prompt(), task.description, task.signature, task.function_name, task.sense)
    i1 = operator_prompt("i1", *args)
    assert task.signature in i1 and "braces" in i1 and "```python" in i1
    for op in ("e1", "e2"):
        text = operator_prompt(op, *args, parents=[p1, p2])
        assert "nearest node first" in text and "first unvisited node" in text
        assert NN.strip() in text and FIRST.strip() in text and "4.03" in text and "lower is better" in text
    assert "totally different" in operator_prompt("e1", *args, parents=[p1, p2])
    assert "common backbone" in operator_prompt("e2", *args, parents=[p1, p2])
    for op, word in (("m1", "modified"), ("m2", "parameter")):
        text = operator_prompt(op, *args, parents=[p1])
        assert word in text and NN.strip() in text and "braces" in text
    with pytest.raises(ValueError):
        operator_prompt("m1", *args, parents=[p1, p2])
    with pytest.raises(ValueError):
        operator_prompt("x9", *args)


def test_rank_selection_favours_better_candidates():
    w = rank_weights(5)
    assert abs(sum(w) - 1) < 1e-12 and all(a > b for a, b in zip(w, w[1:]))
    ranked = ["best", "second", "third", "fourth", "worst"]
    rng = random.Random(0)
    counts = Counter(select_parents(ranked, 1, rng)[0] for _ in range(20000))
    assert counts["best"] > counts["second"] > counts["third"] > counts["fourth"] > counts["worst"]
    pair = select_parents(ranked, 2, rng)
    assert len(set(pair)) == 2
    with pytest.raises(ValueError):
        select_parents(ranked, 6, rng)


def test_eoh_population_initialises_then_uses_operators_and_keeps_the_best():
    task = get_task("tsp20")
    prop = EoHProposer(task, EoHConfig(pop_size=2, parents=2, operators=["e1", "e2", "m1", "m2"]))
    rng = random.Random(0)
    assert [p.operator for p in prop.plan(0, 3, rng)] == ["i1"] * 3
    cands = [Candidate(index=i, batch=0, operator="i1", code=NN, valid=True, objective=o)
             for i, o in enumerate([5.0, 4.0, 6.0])]
    cands.append(Candidate(index=3, batch=0, operator="i1", code=FIRST, valid=False, reason="x"))
    cands.append(Candidate(index=4, batch=0, operator="i1", code=NN, valid=True, objective=3.0, duplicate="code"))
    prop.observe(cands)
    assert [c.index for c in prop.population] == [1, 0]  # best two, no invalid, no duplicate
    plans = prop.plan(1, 4, rng)
    assert [p.operator for p in plans] == ["e1", "e2", "m1", "m2"]
    assert [len(p.parents) for p in plans] == [2, 2, 1, 1]
    assert all("score 4" in p.prompt or "score 5" in p.prompt for p in plans)


# -------------------------------------------------------------------------- duplicates / invalid
def test_evaluator_flags_code_and_objective_duplicates_and_invalid():
    task = get_task("tsp20")
    ev = CandidateEvaluator(task, eval_seed=0, n_instances=2, workers=2)
    nn_with_comment = NN.replace("    d =", "    # nearest\n    d =")
    nn_other_form = NN.replace("int(np.argmin(d))", "int(d.argmin())")  # same tours, different code
    cands = [Candidate(index=i, batch=0, operator="sample", code=c)
             for i, c in enumerate([NN, nn_with_comment, nn_other_form, ILLEGAL, None])]
    cands[4].reason = "unparsable reply: no Python code found in the reply"
    ev.evaluate(cands)
    assert cands[0].valid and cands[0].duplicate is None
    assert cands[1].duplicate == "code" and cands[1].duplicate_of == 0 and cands[1].objective == cands[0].objective
    assert cands[2].duplicate == "objective" and cands[2].duplicate_of == 0
    assert not cands[3].valid and "illegal move" in cands[3].reason and cands[3].objective is None
    assert not cands[4].valid and cands[4].reason.startswith("unparsable reply")
    ref = task.reference(0, 2)
    assert cands[0].objective == pytest.approx(ref["greedy"]) and cands[0].normalised == pytest.approx(0.0)
    fit = batch_fitness(cands, invalid_fitness=-1.0)
    assert fit[:3] == [cands[0].normalised] * 3 and fit[3] == fit[4] == -1.0


def test_batch_fitness_invalid_never_beats_valid():
    cands = [Candidate(index=0, batch=0, operator="s", valid=True, objective=9.0, normalised=-2.5),
             Candidate(index=1, batch=0, operator="s", valid=False)]
    assert batch_fitness(cands, -1.0) == [-2.5, -2.5]


# ------------------------------------------------------------------------------ scripted policy
class ScriptedPolicy(Policy):
    """Returns scripted replies in order; 'weights' are a counter that apply() changes."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.calls = []
        self.updates = []
        self.perturbed_members = []
        self._in_member = None

    def generate(self, chats, sampling, action_regex=None, seed=0):
        out = []
        for chat in chats:
            self.calls.append((chat[-1]["content"], self._in_member, seed))
            out.append(self.replies.pop(0) if self.replies else "no idea")
        return out

    @contextlib.contextmanager
    def perturbed(self, member):
        self._in_member = member
        self.perturbed_members.append(member)
        try:
            yield
        finally:
            self._in_member = None

    def apply(self, update):
        self.updates.append(update)

    def fingerprint(self):
        return hashlib.sha256(json.dumps([u.to_json() for u in self.updates]).encode()).hexdigest()[:16]

    def save(self, directory):
        pass

    def master_weights(self):
        return {}

    def load_master_weights(self, weights):
        pass


def _config(tmp_path, **kw):
    base = dict(task="tsp20", method="sample", budget=4, population=2, eval_instances=2, eval_workers=1,
                runs_dir=str(tmp_path), run_name=None)
    base.update(kw)
    cfg = AHDConfig(**{k: v for k, v in base.items() if k not in ("max_new_tokens",)})
    cfg.sampling.max_new_tokens = kw.get("max_new_tokens", 16)
    return cfg


def _read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("method", ["sample", "eoh"])
def test_loop_with_scripted_policy_finds_the_reference(tmp_path, method):
    replies = ["garbage, no code", f"{{Use the first node.}}\n```python\n{FIRST}```",
               f"{{Go to the nearest unvisited node.}}\n```python\n{NN}```", f"```python\n{ILLEGAL}```"]
    policy = ScriptedPolicy(replies)
    summary = run_ahd(_config(tmp_path, method=method, run_name=method), policy=policy)
    task = get_task("tsp20")
    ref = task.reference(0, 2)
    assert summary["best_objective"] == pytest.approx(ref["greedy"])
    assert summary["valid_rate"] == 0.5 and summary["proposals"] == 4
    run_dir = tmp_path / method
    cands = _read_jsonl(run_dir / "candidates.jsonl")
    assert [c["valid"] for c in cands] == [False, True, True, False]
    assert cands[0]["reason"].startswith("unparsable reply") and "illegal move" in cands[3]["reason"]
    assert all(c["member"] is None and c["fitness"] is None for c in cands)
    metrics = _read_jsonl(run_dir / "metrics.jsonl")
    best = [m["ahd/best_so_far"] for m in metrics if "ahd/best_so_far" in m]
    assert best[0] is None and best[-1] == pytest.approx(ref["greedy"]) and len(best) == 4
    for name in ("config.yaml", "reference.json", "summary.json", "best.py", "report.md"):
        assert (run_dir / name).exists(), name
    assert not (run_dir / "history.jsonl").exists()
    if method == "eoh":
        # batch 0 fills the empty population with i1; only one heuristic is valid, so the
        # crossovers (e1, e2) of batch 1 fall back to m1 on that single parent
        assert [c["operator"] for c in cands] == ["i1", "i1", "m1", "m1"]
        assert cands[2]["thought"] == "Go to the nearest unvisited node."
        assert cands[2]["parents"] == [1] and cands[3]["parents"] == [1]
        assert "Use the first node." in policy.calls[2][0]
    else:
        assert len({call[0] for call in policy.calls}) == 1  # one fixed prompt
        assert cands[1]["thought"] == ""


def test_coevolution_fitness_equals_normalised_objectives(tmp_path):
    replies = [f"```python\n{NN}```", f"```python\n{FIRST}```", "nothing", f"```python\n{ILLEGAL}```",
               f"```python\n{FIRST}```", f"```python\n{NN}```"]
    policy = ScriptedPolicy(replies)
    cfg = _config(tmp_path, method="agentic-esopt+sample", budget=5, population=2, run_name="co")
    cfg.batched_baselines = True  # irrelevant for co-evolution: one call per member
    summary = run_ahd(cfg, policy=policy)
    assert summary["es_updates"] == 3 and len(policy.updates) == 3
    # every proposal was generated inside perturbed(member), a different member each
    assert all(call[1] is not None for call in policy.calls)
    assert [m.index for m in policy.perturbed_members] == [0, 1, 0, 1, 0]
    assert len({call[2] for call in policy.calls}) == 5  # a seed per proposal
    history = read_history(tmp_path / "co" / "history.jsonl")
    cands = _read_jsonl(tmp_path / "co" / "candidates.jsonl")
    task = get_task("tsp20")
    for update in history:
        batch = [c for c in cands if c["batch"] == update.step]
        expected = [task.normalised_score(c["objective"], 0, 2) if c["valid"] else None for c in batch]
        low = min([-1.0] + [e for e in expected if e is not None])
        assert update.fitness == [e if e is not None else low for e in expected]
        assert update.seeds == [c["member"]["seed"] for c in batch]
        assert [c["fitness"] for c in batch] == update.fitness
    assert len(history[-1].seeds) == 1  # the last, partial batch
    sigmas = [u.sigma for u in history]
    assert sigmas[0] == cfg.es.sigma and sigmas[-1] == pytest.approx(cfg.es.sigma_final)


# ----------------------------------------------------------------------------------- tiny model
def test_coevolution_with_tiny_model_updates_weights_and_survives_garbage(tmp_path, make_tiny_policy):
    policy = make_tiny_policy()
    before = policy.fingerprint()
    cfg = _config(tmp_path, method="agentic-esopt+eoh", budget=4, population=2, run_name="tiny", max_new_tokens=12)
    cfg.es.alpha = 0.1
    # The tiny random model writes garbage: every proposal is invalid, with a reason, and nothing crashes.
    summary = run_ahd(cfg, policy=policy)
    history = read_history(tmp_path / "tiny" / "history.jsonl")
    assert len(history) == 2 and summary["es_updates"] == 2
    cands = _read_jsonl(tmp_path / "tiny" / "candidates.jsonl")
    assert len(cands) == 4 and all(c["member"] is not None for c in cands)
    assert all(not c["valid"] and c["reason"] for c in cands)
    # all-invalid batches have equal fitness: a zero update, the weights do not move
    assert all(u.fitness[0] == u.fitness[1] for u in history)
    assert policy.fingerprint() == before


def test_coevolution_with_tiny_model_moves_weights_when_fitness_differs(tmp_path, make_tiny_policy, monkeypatch):
    import esopt.ahd.loops as ahd

    policy = make_tiny_policy()
    before = policy.fingerprint()
    # Replace the reply parser so that member 0's proposal is nearest neighbour and member 1's is
    # "first unvisited": real generation by the perturbed tiny model, known fitness.
    real = ahd.AHDRun._make_candidate

    def scripted(self, index, batch, plan, reply, seed, member):
        cand = real(self, index, batch, plan, reply, seed, member)
        cand.code, cand.reason = (NN if member.index == 0 else FIRST), None
        return cand

    monkeypatch.setattr(ahd.AHDRun, "_make_candidate", scripted)
    cfg = _config(tmp_path, method="agentic-esopt+sample", budget=4, population=2, run_name="move", max_new_tokens=8)
    cfg.es.alpha = 0.05
    run_ahd(cfg, policy=policy)
    history = read_history(tmp_path / "move" / "history.jsonl")
    assert len(history) == 2
    assert history[0].fitness[0] > history[0].fitness[1]
    assert history[0].coefficients[0] > 0 > history[0].coefficients[1]
    assert policy.fingerprint() != before


# --------------------------------------------------------------------------------- report / CLI
def test_report_gap_ratio_gain(tmp_path):
    assert gap_ratio_gain(2.0, 1.0) == 1.0 and gap_ratio_gain(1.0, 1.0) == 0.0
    assert gap_ratio_gain(1.0, 0.0) == float("inf") and gap_ratio_gain(None, 1.0) is None
    good = ScriptedPolicy([f"```python\n{NN}```"] * 2)
    bad = ScriptedPolicy([f"```python\n{FIRST}```"] * 2)
    run_ahd(_config(tmp_path, method="sample", budget=2, run_name="s"), policy=bad)
    run_ahd(_config(tmp_path, method="agentic-esopt+sample", budget=2, run_name="a"), policy=good)
    text = compare_runs([tmp_path / "s", tmp_path / "a"])
    assert "tsp20" in text and "near-optimal: LKH-3" in text
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("agentic-esopt+sample"))
    reference = json.loads((tmp_path / "s" / "reference.json").read_text())
    target = reference["optimum"]
    g_s = abs(load_run(tmp_path / "s").best - target)
    g_a = abs(load_run(tmp_path / "a").best - target)
    assert f"vs sample {g_s / g_a - 1:+.3f}" in line
    table = {ln[:24].strip(): ln[24:].split() for ln in text.split("\n\n")[0].splitlines()[1:]}  # the Table 5 layout
    assert table[""] == ["tsp20"]
    assert table["Greedy Construct"] == [f"{reference['greedy']:.4f}"] and table["Optimal"] == [f"{target:.4f}"]
    assert table["Sample"] == [f"{load_run(tmp_path / 's').best:.4f}"]
    assert table["Agentic ESOpt + Sample"] == [f"{load_run(tmp_path / 'a').best:.4f}"]
    assert table["Gain"] == [f"{g_s / g_a - 1:+.3f}"]


def test_cli_errors_are_one_line(tmp_path, capsys):
    from esopt.cli import main as esopt_main

    assert esopt_main(["ahd", "run", "--task", "nope", "--runs_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("esopt: error: unknown AHD task 'nope'") and "\n" not in err
    assert esopt_main(["ahd", "run", "--method", "magic"]) == 2
    assert "unknown method 'magic'" in capsys.readouterr().err
    assert esopt_main(["ahd", "run", "--budget", "0"]) == 2
    assert "budget must be an integer >= 1" in capsys.readouterr().err
    assert esopt_main(["ahd", "report", str(tmp_path)]) == 2
    assert "not an AHD run directory" in capsys.readouterr().err
    assert esopt_main(["ahd", "tasks"]) == 0
    out = capsys.readouterr().out
    assert "tsp20" in out and "aco_binpacking500" in out


def test_config_validation():
    with pytest.raises(ConfigError, match="eoh.operators"):
        cfg = AHDConfig()
        cfg.eoh.operators = ["e1", "zz"]
        cfg.validate()
