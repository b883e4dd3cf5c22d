"""Automatic heuristic design outer loops: independent Sample, EoH, and their co-evolution with ES.

Methods (all spend the same budget T = number of proposals, in batches of G):

- `sample`: every proposal answers the same fixed prompt (the task, its signature and a simple
  example) by temperature sampling.
- `eoh`: Evolution of Heuristics. A population of P heuristics is kept by objective; each proposal
  applies one operator (i1 new, e1 different from parents, e2 common idea of parents, m1 modify,
  m2 change parameters) to parents drawn by rank-based selection, and answers with a one-sentence
  thought in braces plus code. Duplicates (same normalised code, or same per-instance objectives)
  and invalid heuristics never enter the population.
- `agentic-esopt+sample` / `agentic-esopt+eoh`: the same loops, but proposal i of a batch is
  written by ES member i (inside `policy.perturbed(member)`); the candidate's normalised objective
  (relative improvement over the task's greedy baseline; an invalid candidate gets a fixed low
  fitness) is that member's fitness, and after every batch one ES update (Strategy.tell +
  policy.apply) moves the weights. Sigma cosine-decays to ~0 over the ceil(T/G) updates.

A run writes `runs/ahd_<task>__<method>__<seed>__<time>/`: config.yaml, reference.json,
candidates.jsonl (one line per proposal), history.jsonl (ES updates, co-evolution only),
metrics.jsonl (best-so-far per evaluation, per-batch ES and time stats), summary.json, best.py,
report.md and best_so_far.png (when matplotlib is installed).

    esopt ahd run --task tsp20 --method agentic-esopt+eoh --budget 64 --population 8
    esopt ahd report runs/ahd_tsp20__*
    esopt ahd tasks
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from esopt.confutil import ConfigError, leaf_fields, load_yaml, opt, set_path, to_dict
from esopt.es import ESConfig, HistoryWriter, Member, derive_seed, make_strategy
from esopt.policy.base import Policy, SamplingConfig
from esopt.policy.hf import ModelConfig
from esopt.sandbox import ISOLATIONS, IsolationUnavailable, require_isolation
from esopt.ahd.prompts import (
    EOH_OPERATORS,
    OPERATOR_PARENTS,
    SYSTEM_PROMPT,
    ExtractionError,
    Parent,
    extract_code,
    extract_thought,
    normalise_code,
    operator_prompt,
    sample_prompt,
    select_parents,
)

METHODS = ("sample", "eoh", "agentic-esopt+sample", "agentic-esopt+eoh")


# ------------------------------------------------------------------------------------------ config
def _default_sampling() -> SamplingConfig:
    return SamplingConfig(temperature=0.8, top_p=0.95, top_k=0, max_new_tokens=320, stop=[])


def _default_es() -> ESConfig:
    return ESConfig(strategy="agentic-esopt", population=8, sigma=1e-3, sigma_final=1e-7, alpha=5e-4)


@dataclass
class EoHConfig:
    """Evolution of Heuristics settings."""

    pop_size: int = opt(4, "P: heuristics kept in the population (the best by objective, no duplicates)")
    parents: int = opt(2, "parents shown to the crossover operators e1 and e2 (m1 and m2 use one)")
    operators: list = opt(["e1", "e2", "m1", "m2"], "operators cycled through after initialisation (i1 fills an empty population)")


@dataclass
class AHDConfig:
    """One AHD run: a task, a method, a proposal budget."""

    task: str = opt("tsp20", "AHD task (`esopt ahd tasks` lists them)")
    method: str = opt("sample", "sample | eoh | agentic-esopt+sample | agentic-esopt+eoh")
    budget: int = opt(16, "T: total proposals (LLM replies, each evaluated once); the same for every method")
    population: int = opt(8, "G: proposals per batch; the ES population of the co-evolution methods")
    seed: int = opt(0, "run seed: generation seeds, parent selection and ES member seeds derive from it")
    eval_instances: int = opt(0, "instances each heuristic is evaluated on (0 = the task's default)")
    eval_seed: int = opt(0, "seed of the evaluation instances (fixed, so runs compare)")
    invalid_fitness: float = opt(-1.0, "ES fitness of an invalid proposal: min(this, the batch's lowest valid fitness)")
    eval_workers: int = opt(2, "sandbox evaluations run in parallel (each in its own subprocess)")
    isolation: str = opt("bwrap", "containment of the LLM-written heuristics: bwrap (OS isolation; the run is refused "
                                  "when it cannot be set up) | python (the in-process audit hook and rlimits only: "
                                  "not a security boundary)")
    batched_baselines: bool = opt(True, "baselines generate a batch in one call (seed derived per batch); false = one call per proposal like co-evolution")
    model: ModelConfig = opt(ModelConfig(), "the proposal model")
    sampling: SamplingConfig = opt(_default_sampling(), "decoding of proposals (temperature sampling)")
    es: ESConfig = opt(_default_es(), "ES settings of the co-evolution methods (es.population is --population)")
    eoh: EoHConfig = opt(EoHConfig(), "EoH settings (eoh and agentic-esopt+eoh)")
    runs_dir: str = opt("runs", "parent directory of run directories")
    run_name: str | None = opt(None, "run directory name (default: ahd_<task>__<method>__<seed>__<time>)")

    @property
    def coevolve(self) -> bool:
        return self.method.startswith("agentic-esopt+")

    @property
    def loop(self) -> str:
        """'sample' or 'eoh': the outer loop, with or without ES."""
        return self.method.split("+")[-1]

    @property
    def batches(self) -> int:
        return math.ceil(self.budget / self.population)

    def validate(self) -> None:
        from esopt.ahd.tasks import task_names

        if self.task not in task_names():
            raise ConfigError(f"unknown AHD task {self.task!r}; available: {', '.join(task_names())}")
        if self.method not in METHODS:
            raise ConfigError(f"unknown method {self.method!r}; expected one of {', '.join(METHODS)}")
        if self.isolation not in ISOLATIONS:
            raise ConfigError(f"isolation must be one of {', '.join(ISOLATIONS)}, got {self.isolation!r}")
        for name in ("budget", "population", "eval_workers"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
        if self.eval_instances < 0:
            raise ConfigError(f"eval_instances must be >= 0, got {self.eval_instances}")
        if not math.isfinite(self.invalid_fitness):
            raise ConfigError(f"invalid_fitness must be finite, got {self.invalid_fitness}")
        try:
            SamplingConfig(**dataclasses.asdict(self.sampling))
            ModelConfig(**dataclasses.asdict(self.model))
        except TypeError as e:
            raise ConfigError(str(e)) from None
        self.es.population = self.population
        self.es.antithetic = False  # each member writes its own proposal
        self.es.validate()
        if self.eoh.pop_size < 1 or self.eoh.parents < 1:
            raise ConfigError("eoh.pop_size and eoh.parents must be >= 1")
        bad = [op for op in self.eoh.operators if op not in EOH_OPERATORS]
        if bad or not self.eoh.operators:
            raise ConfigError(f"eoh.operators must be a non-empty list of {', '.join(EOH_OPERATORS)}; got {self.eoh.operators!r}")

    def to_yaml(self) -> str:
        return yaml.safe_dump(to_dict(self), sort_keys=False)


def load_ahd_config(path: str | Path | None) -> AHDConfig:
    """AHDConfig from a YAML file (None = defaults); unknown keys are errors."""
    return load_yaml(AHDConfig, path)


# -------------------------------------------------------------------------------------- candidates
@dataclass
class Candidate:
    """One proposal: what was asked, what came back, how it scored."""

    index: int
    batch: int
    operator: str
    parents: list = field(default_factory=list)
    """Candidate indices of the parents shown in the prompt."""
    thought: str = ""
    code: str | None = None
    reply: str = ""
    valid: bool = False
    objective: float | None = None
    normalised: float | None = None
    """task.normalised_score(objective): relative improvement over the greedy baseline."""
    reason: str | None = None
    per_instance: list = field(default_factory=list)
    member: dict | None = None
    """The ES member that wrote it (index, seed, sigma, sign); None for the baselines."""
    fitness: float | None = None
    """The ES fitness it gave its member (co-evolution only)."""
    duplicate: str | None = None
    """'code' (same normalised code as an earlier candidate, not re-evaluated) or 'objective'
    (same per-instance objectives as an earlier candidate); duplicates never enter the EoH population."""
    duplicate_of: int | None = None
    gen_seed: int = 0
    eval_s: float = 0.0

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def as_parent(self) -> Parent:
        return Parent(self.thought, self.code or "", float(self.objective))


def _better(a: float, b: float, sense: str) -> bool:
    return a < b if sense == "min" else a > b


def _objective_key(per_instance: list, objective: float) -> tuple:
    values = per_instance or [objective]
    return tuple(f"{float(x):.10g}" for x in values)


class Evaluator:
    """Extracts and evaluates candidates, caching by normalised code and flagging duplicates."""

    def __init__(self, task, eval_seed: int, n_instances: int | None, workers: int, limits=None):
        self.task = task
        self.limits = limits
        """Sandbox limits of every evaluation (None: the task's defaults)."""
        self.seed = eval_seed
        self.n = n_instances
        self.workers = workers
        self._by_code: dict[str, int] = {}
        self._by_objective: dict[tuple, int] = {}
        self._results: dict[int, Any] = {}

    def _evaluate(self, code: str):
        from esopt.ahd.tasks import Evaluation

        try:
            return self.task.evaluate(code, seed=self.seed, n_instances=self.n, limits=self.limits)
        except Exception as e:  # the evaluator itself failed: record it, never silently
            return Evaluation(False, reason=f"evaluator error: {type(e).__name__}: {e}")

    def evaluate(self, candidates: list[Candidate]) -> None:
        """Fill valid/objective/reason/normalised/duplicate of each candidate (in order)."""
        fresh: dict[str, Candidate] = {}
        keys: dict[int, str] = {}
        for cand in candidates:
            if cand.code is None:
                continue
            key = normalise_code(cand.code)
            keys[cand.index] = key
            if key in self._by_code or key in fresh:
                continue
            fresh[key] = cand
        todo = list(fresh.items())
        if todo:
            with ThreadPoolExecutor(max_workers=min(self.workers, len(todo))) as pool:
                results = list(pool.map(lambda kv: self._evaluate(kv[1].code), todo))
            for (key, cand), ev in zip(todo, results):
                self._by_code[key] = cand.index
                self._results[cand.index] = ev
        for cand in candidates:
            if cand.code is None:
                continue
            first = self._by_code[keys[cand.index]]
            ev = self._results[first]
            cand.valid, cand.reason, cand.eval_s = bool(ev.valid), ev.reason, ev.duration_s
            cand.objective = float(ev.objective) if ev.valid else None
            cand.per_instance = [float(x) for x in ev.per_instance]
            if first != cand.index:
                cand.duplicate, cand.duplicate_of, cand.eval_s = "code", first, 0.0
            if cand.valid:
                cand.normalised = self.task.normalised_score(cand.objective, self.seed, self.n)
                if cand.duplicate is None:
                    okey = _objective_key(cand.per_instance, cand.objective)
                    if okey in self._by_objective:
                        cand.duplicate, cand.duplicate_of = "objective", self._by_objective[okey]
                    else:
                        self._by_objective[okey] = cand.index


# ---------------------------------------------------------------------------------------- proposers
@dataclass
class Plan:
    operator: str
    parents: list  # Candidates
    prompt: str


class SampleProposer:
    """Independent sampling: the same fixed prompt for every proposal."""

    def __init__(self, task):
        self.prompt = sample_prompt(task.prompt(), task.function_name)

    def plan(self, batch: int, n: int, rng: random.Random) -> list[Plan]:
        return [Plan("sample", [], self.prompt) for _ in range(n)]

    def observe(self, candidates: list[Candidate]) -> None:
        pass

    def state(self) -> dict:
        return {}


class EoHProposer:
    """EoH: a population of the best P distinct valid heuristics, grown by the five operators."""

    def __init__(self, task, config: EoHConfig):
        self.task = task
        self.config = config
        self.population: list[Candidate] = []  # best first
        self._cursor = 0

    def _sorted(self, cands: list[Candidate]) -> list[Candidate]:
        sign = 1.0 if self.task.sense == "min" else -1.0
        return sorted(cands, key=lambda c: (sign * c.objective, c.index))

    def _prompt(self, operator: str, parents: list[Candidate]) -> str:
        t = self.task
        return operator_prompt(operator, t.prompt(), t.description, t.signature, t.function_name, t.sense,
                               [p.as_parent() for p in parents])

    def plan(self, batch: int, n: int, rng: random.Random) -> list[Plan]:
        plans = []
        for _ in range(n):
            op = "i1" if not self.population else self.config.operators[self._cursor % len(self.config.operators)]
            if self.population:
                self._cursor += 1
            need = OPERATOR_PARENTS[op]
            if need is None:
                need = min(self.config.parents, len(self.population))
                if need < 2:  # a crossover needs two parents: mutate the one we have instead
                    op, need = "m1", 1
            parents = select_parents(self.population, need, rng) if need else []
            plans.append(Plan(op, parents, self._prompt(op, parents)))
        return plans

    def observe(self, candidates: list[Candidate]) -> None:
        new = [c for c in candidates if c.valid and c.duplicate is None]
        self.population = self._sorted(self.population + new)[: self.config.pop_size]

    def state(self) -> dict:
        return {"population": [c.index for c in self.population],
                "population_objectives": [c.objective for c in self.population]}


# ------------------------------------------------------------------------------------------- run
def new_run_dir(config: AHDConfig) -> Path:
    name = config.run_name or (
        f"ahd_{config.task}__{config.method}__{config.seed}__{datetime.now().strftime('%Y%m%d-%H%M%S')}")
    run_dir = Path(config.runs_dir) / name
    if (run_dir / "candidates.jsonl").exists():
        raise ConfigError(f"run directory {run_dir} already holds a run; choose another --run_name")
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def batch_fitness(candidates: list[Candidate], invalid_fitness: float) -> list[float]:
    """ES fitness of a batch: each valid candidate's normalised objective; an invalid one gets
    min(invalid_fitness, lowest valid fitness of the batch), so it never beats a valid proposal."""
    valid = [c.normalised for c in candidates if c.valid and c.normalised is not None]
    low = min([invalid_fitness] + valid)
    return [float(c.normalised) if c.valid and c.normalised is not None else float(low) for c in candidates]


class AHDRun:
    """Runs one method for `budget` proposals; see the module docstring."""

    def __init__(self, config: AHDConfig, run_dir: Path, policy: Policy, console=None):
        from rich.console import Console

        from esopt.ahd.tasks import get_task

        config.validate()
        self.config = config
        self.run_dir = Path(run_dir)
        self.policy = policy
        self.console = console or Console()
        self.task = get_task(config.task)
        self.n_instances = config.eval_instances or None
        self.limits = dataclasses.replace(self.task.default_limits, isolation=config.isolation)
        self.reference = self.task.reference(config.eval_seed, self.n_instances, limits=self.limits)
        self.evaluator = Evaluator(self.task, config.eval_seed, self.n_instances, config.eval_workers, self.limits)
        self.proposer = EoHProposer(self.task, config.eoh) if config.loop == "eoh" else SampleProposer(self.task)
        self.strategy = make_strategy(config.es, config.batches, config.seed) if config.coevolve else None
        self.candidates: list[Candidate] = []
        self.best: Candidate | None = None

    @classmethod
    def start(cls, config: AHDConfig, policy: Policy | None = None, console=None) -> "AHDRun":
        config.validate()
        try:
            require_isolation(config.isolation)
        except IsolationUnavailable as e:  # refuse before anything is written or loaded
            raise ConfigError(str(e)) from None
        run_dir = new_run_dir(config)
        (run_dir / "config.yaml").write_text(config.to_yaml())
        if policy is None:
            from esopt.policy import load_policy

            policy = load_policy(config.model)
        return cls(config, run_dir, policy, console)

    # ---- generation --------------------------------------------------------------------------
    def _chat(self, prompt: str) -> list[dict]:
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": prompt}]

    def _generate(self, batch: int, plans: list[Plan], members: list[Member] | None,
                  seeds: list[int]) -> tuple[list[str], dict]:
        cfg = self.config
        times = {"generate_s": 0.0, "perturb_s": 0.0}
        replies: list[str] = []
        if members is None and cfg.batched_baselines:
            t0 = time.perf_counter()
            replies = self.policy.generate([self._chat(p.prompt) for p in plans], cfg.sampling,
                                           seed=derive_seed(cfg.seed, "batch", batch))
            times["generate_s"] += time.perf_counter() - t0
            return replies, times
        for i, plan in enumerate(plans):
            t0 = time.perf_counter()
            if members is None:
                replies += self.policy.generate([self._chat(plan.prompt)], cfg.sampling, seed=seeds[i])
                times["generate_s"] += time.perf_counter() - t0
                continue
            with self.policy.perturbed(members[i]):
                t1 = time.perf_counter()
                replies += self.policy.generate([self._chat(plan.prompt)], cfg.sampling, seed=seeds[i])
                t2 = time.perf_counter()
            t3 = time.perf_counter()
            times["generate_s"] += t2 - t1
            times["perturb_s"] += (t1 - t0) + (t3 - t2)
        return replies, times

    # ---- the loop ----------------------------------------------------------------------------
    def _make_candidate(self, index: int, batch: int, plan: Plan, reply: str, seed: int,
                        member: Member | None) -> Candidate:
        cand = Candidate(index=index, batch=batch, operator=plan.operator,
                         parents=[p.index for p in plan.parents], reply=reply, gen_seed=seed,
                         member=dataclasses.asdict(member) if member is not None else None)
        try:
            cand.code = extract_code(reply, self.task.function_name)
        except ExtractionError as e:
            cand.reason = f"unparsable reply: {e}"
        cand.thought = extract_thought(reply) if plan.operator != "sample" else ""
        return cand

    def _step(self, batch: int) -> list[Candidate]:
        cfg = self.config
        start = time.perf_counter()
        done = len(self.candidates)
        n = min(cfg.population, cfg.budget - done)
        rng = random.Random(derive_seed(cfg.seed, "select", batch))
        plans = self.proposer.plan(batch, n, rng)
        members = self.strategy.ask(batch)[:n] if self.strategy else None
        seeds = [derive_seed(cfg.seed, "proposal", done + i) for i in range(n)]
        replies, times = self._generate(batch, plans, members, seeds)
        batch_cands = [self._make_candidate(done + i, batch, plans[i], replies[i], seeds[i],
                                            members[i] if members else None) for i in range(n)]
        t0 = time.perf_counter()
        self.evaluator.evaluate(batch_cands)
        times["eval_s"] = time.perf_counter() - t0
        values: dict[str, Any] = {}
        if self.strategy is not None:
            fitness = batch_fitness(batch_cands, cfg.invalid_fitness)
            for cand, f in zip(batch_cands, fitness):
                cand.fitness = f
            update = self.strategy.tell(batch, members, fitness)
            t0 = time.perf_counter()
            self.policy.apply(update)
            times["update_s"] = time.perf_counter() - t0
            self.history.append(update)
            values.update({"es/sigma": update.sigma, "es/alpha": update.alpha,
                           "es/fitness_mean": update.stats["mean"], "es/fitness_std": update.stats["std"],
                           "es/fitness_max": update.stats["max"], "es/update": batch + 1})
        self.proposer.observe(batch_cands)
        with (self.run_dir / "candidates.jsonl").open("a") as f:
            for cand in batch_cands:
                f.write(json.dumps(cand.to_json()) + "\n")
        for cand in batch_cands:
            self.candidates.append(cand)
            if cand.valid and (self.best is None or _better(cand.objective, self.best.objective, self.task.sense)):
                self.best = cand
            self.metrics.log(cand.index + 1, self._eval_metrics(cand))
        n_valid = sum(c.valid for c in batch_cands)
        values.update({"batch/valid_rate": n_valid / n, "batch/duplicates": sum(c.duplicate is not None for c in batch_cands),
                       **{f"time/{k}": v for k, v in times.items()}, "time/batch_s": time.perf_counter() - start})
        values.update({f"eoh/{k}": v for k, v in self.proposer.state().items()})
        self.metrics.log(len(self.candidates), values)
        return batch_cands

    def _eval_metrics(self, cand: Candidate) -> dict:
        k = len(self.candidates)
        valid = sum(c.valid for c in self.candidates)
        return {
            "ahd/objective": cand.objective,
            "ahd/valid": cand.valid,
            "ahd/operator": cand.operator,
            "ahd/best_so_far": self.best.objective if self.best else None,
            "ahd/best_normalised": self.best.normalised if self.best else None,
            "ahd/valid_rate": valid / k,
        }

    def run(self) -> dict:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        from esopt.train.logging import MetricsLogger

        cfg = self.config
        (self.run_dir / "reference.json").write_text(json.dumps(
            {k: v for k, v in self.reference.items() if not k.endswith("per_instance")}, indent=1))
        self.metrics = MetricsLogger(self.run_dir)
        self.console.print(f"LLM-written heuristics run in the sandbox with isolation: {cfg.isolation}")
        self.history = HistoryWriter(self.run_dir / "history.jsonl") if self.strategy else None
        start = time.perf_counter()
        columns = [TextColumn("[progress.description]{task.description}"), BarColumn(),
                   TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                   TextColumn("best {task.fields[best]}  valid {task.fields[valid]}")]
        try:
            with Progress(*columns, console=self.console, transient=False) as progress:
                bar = progress.add_task(f"{cfg.task} {cfg.method}", total=cfg.budget, best="-", valid="-")
                for batch in range(cfg.batches):
                    self._step(batch)
                    rate = sum(c.valid for c in self.candidates) / len(self.candidates)
                    progress.update(bar, completed=len(self.candidates), valid=f"{rate:.2f}",
                                    best=f"{self.best.objective:.4g}" if self.best else "-")
        finally:
            if self.history is not None:
                self.history.close()
            self.metrics.close()
        seconds = time.perf_counter() - start
        summary = self._summary(seconds)
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
        if self.best is not None:
            (self.run_dir / "best.py").write_text(
                f"# {cfg.task} / {cfg.method}: objective {self.best.objective:.6g} "
                f"(candidate {self.best.index}, operator {self.best.operator})\n"
                f"# idea: {self.best.thought}\n{self.best.code}")
        from esopt.ahd.report import write_run_report

        summary.update(write_run_report(self.run_dir))
        summary["run_dir"] = str(self.run_dir)
        return summary

    def _summary(self, seconds: float) -> dict:
        cfg = self.config
        n = len(self.candidates)
        best = self.best
        return {
            "task": cfg.task, "method": cfg.method, "budget": cfg.budget, "population": cfg.population,
            "seed": cfg.seed, "eval_seed": cfg.eval_seed, "isolation": cfg.isolation,
            "eval_instances": cfg.eval_instances or self.task.default_instances,
            "proposals": n,
            "valid_rate": sum(c.valid for c in self.candidates) / n if n else 0.0,
            "duplicates": sum(c.duplicate is not None for c in self.candidates),
            "best_objective": best.objective if best else None,
            "best_normalised": best.normalised if best else None,
            "best_index": best.index if best else None,
            "greedy": self.reference.get("greedy"),
            "es_updates": cfg.batches if cfg.coevolve else 0,
            "fingerprint": self.policy.fingerprint(),
            "seconds": seconds,
        }


def run_ahd(config: AHDConfig, policy: Policy | None = None, console=None) -> dict:
    """Start and finish one run; returns its summary (with run_dir)."""
    return AHDRun.start(config, policy=policy, console=console).run()


# ------------------------------------------------------------------------------------------- CLI
def _run_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="esopt ahd run", description="Run an AHD method for a proposal budget.")
    parser.add_argument("--config", help="YAML config (configs/ahd_*.yaml); flags override it")
    for path, _, help_text, default in leaf_fields(AHDConfig):
        if path in ("es.population", "es.antithetic"):
            continue
        parser.add_argument(f"--{path}", dest=f"cfg:{path}", default=argparse.SUPPRESS, metavar="V",
                            help=f"{help_text} (default: {default})")
    return parser


def cmd_run(argv: list[str]) -> int:
    from rich.console import Console

    args = _run_parser().parse_args(argv)
    config = load_ahd_config(args.config)
    for key, value in vars(args).items():
        if key.startswith("cfg:"):
            set_path(config, key[4:], value)
    config.validate()
    console = Console()
    summary = run_ahd(config, console=console)
    best = summary["best_objective"]
    console.print(
        f"{config.task} / {config.method}: best objective "
        + (f"{best:.6g} (normalised {summary['best_normalised']:+.4f} vs greedy {summary['greedy']:.6g})"
           if best is not None else "none (no valid proposal)")
        + f"; valid {summary['valid_rate']:.0%} of {summary['proposals']} proposals; {summary['seconds']:.0f}s")
    console.print(f"run directory: {summary['run_dir']}")
    return 0


def cmd_report(argv: list[str]) -> int:
    from esopt.ahd.report import compare_runs

    parser = argparse.ArgumentParser(prog="esopt ahd report", description="Compare AHD runs per task.")
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    parser.add_argument("--plot", metavar="PNG", help="also write best-so-far curves of every run here")
    args = parser.parse_args(argv)
    print(compare_runs(args.run_dirs, plot=args.plot))
    return 0


def cmd_tasks(argv: list[str]) -> int:
    from esopt.ahd.tasks import get_task, task_names

    argparse.ArgumentParser(prog="esopt ahd tasks", description="List AHD tasks.").parse_args(argv)
    for name in task_names():
        task = get_task(name)
        print(f"{name:20s} {task.sense}  {task.function_name:18s} greedy: {task.greedy_name}; "
              f"{task.default_instances} instance(s)")
    return 0


SUBCOMMANDS = {"run": cmd_run, "report": cmd_report, "tasks": cmd_tasks}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: esopt ahd {run,report,tasks} [options]   (esopt ahd COMMAND --help for options)")
        return 0
    if argv[0] not in SUBCOMMANDS:
        print(f"esopt ahd: error: unknown subcommand {argv[0]!r}; expected one of {', '.join(SUBCOMMANDS)}",
              file=sys.stderr)
        return 2
    try:
        return SUBCOMMANDS[argv[0]](argv[1:])
    except ConfigError as e:
        print(f"esopt ahd: error: {e}", file=sys.stderr)
        return 2
