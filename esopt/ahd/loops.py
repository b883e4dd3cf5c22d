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

import dataclasses
import json
import random
import time
from pathlib import Path
from typing import Any

from esopt.ahd.candidates import Candidate, CandidateEvaluator
from esopt.ahd.config import AHDConfig
from esopt.ahd.prompts import SYSTEM_PROMPT, ExtractionError, extract_code, extract_thought
from esopt.ahd.proposers import EoHProposer, Plan, SampleProposer
from esopt.confutil import ConfigError
from esopt.es import HistoryWriter, Member, derive_seed, make_strategy
from esopt.policy.base import Policy
from esopt.sandbox import IsolationUnavailable, require_isolation


def _better(a: float, b: float, sense: str) -> bool:
    return a < b if sense == "min" else a > b


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
        self.evaluator = CandidateEvaluator(self.task, config.eval_seed, self.n_instances, config.eval_workers, self.limits)
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
        run_dir = config.create_run_dir()
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
