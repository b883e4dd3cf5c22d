"""Running the Trace2Skill conditions into one experiment directory (what each condition does: the
package docstring)."""

from __future__ import annotations

import copy
import json
import shutil
import time
from pathlib import Path

from esopt.confutil import ConfigError
from esopt.envs import make_env
from esopt.es import derive_seed
from esopt.experiments.skill.config import CONDITIONS, LABELS, RESULT_FILE, SkillRunConfig
from esopt.policy.base import Policy, load_checkpoint_weights
from esopt.rollout import rollout
from esopt.skills.analyst import Analyst, make_analyst
from esopt.skills.distill import SKILL_FILE, distill, read_log
from esopt.skills.document import Skill, SkillError, seed_skill
from esopt.train.es_trainer import ESTrainer, checkpoints
from esopt.train.evaluate import evaluate


class SkillExperiment:
    """Runs conditions into one experiment directory. `policy` and `analyst` default to the config's
    (tests pass a tiny policy and a ScriptedAnalyst)."""

    def __init__(self, config: SkillRunConfig, policy: Policy | None = None, analyst: Analyst | None = None,
                 console=None, force: bool = False):
        from rich.console import Console

        config.validate()
        self.config = config
        self.console = console or Console()
        self.dir = config.experiment_dir
        self.force = force
        if policy is None:
            from esopt.policy.hf import HFPolicy

            policy = HFPolicy.load(config.model)
        self.policy = policy
        self.base_weights = {n: t.detach().clone() for n, t in policy.master_weights().items()}
        self.env = make_env(config.env.name, config.env.options)
        self.eval_tasks = self.env.tasks("eval", config.eval_tasks, config.eval_seed)
        self._analyst = analyst

    # ---- helpers ---------------------------------------------------------------------------
    @property
    def analyst(self) -> Analyst:
        if self._analyst is None:
            self._analyst = make_analyst(self.config.analyst, self.policy)
        return self._analyst

    def _reset_weights(self) -> None:
        if self.base_weights:
            self.policy.load_master_weights(self.base_weights)

    def _condition_dir(self, name: str, es_run: bool = False) -> Path:
        path = self.dir / name
        if path.exists() and (path / RESULT_FILE).exists() or (es_run and (path / "history.jsonl").exists()):
            if not self.force:
                raise ConfigError(f"{path} already holds a result; pass --force to run it again")
            shutil.rmtree(path)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _initial_skill(self) -> Skill:
        cfg = self.config
        try:
            skill = Skill.load(cfg.skill) if cfg.skill else seed_skill(cfg.env.name)
            return skill.validate(cfg.distill.limits)
        except SkillError as e:
            raise ConfigError(f"starting skill: {e}") from None

    def _evaluate(self, out: Path, skill_path: Path | None) -> dict:
        cfg = self.config
        rollout_config = copy.deepcopy(cfg.rollout)
        rollout_config.skill = str(skill_path) if skill_path else ""
        rollout_config.sampling.temperature = cfg.eval_temperature
        return evaluate(self.policy, self.env, self.eval_tasks, rollout_config, cfg.samples, cfg.eval_seed,
                        out=str(out / "eval_trajectories.jsonl"))

    def _finish(self, name: str, out: Path, metrics: dict, start: float, skill_path: Path | None = None,
                **extra) -> dict:
        log = [r for r in read_log(out) if r["kind"] == "proposal"] if skill_path else []
        result = {
            "condition": name,
            "label": LABELS[name],
            "env": self.config.env.name,
            "metrics": metrics,
            "skill": Skill.load(skill_path).tag if skill_path else None,
            "skill_file": str(skill_path.relative_to(self.dir)) if skill_path else None,
            "analyst": {"kind": getattr(self.analyst, "name", "?") if skill_path else None,
                        "proposals": len(log), "valid": sum(r["valid"] for r in log)},
            "fingerprint": self.policy.fingerprint(),
            "seconds": time.perf_counter() - start,
            **extra,
        }
        (out / RESULT_FILE).write_text(json.dumps(result, indent=1))
        k = self.config.samples
        self.console.print(
            f"[bold]{LABELS[name]}[/]: Mean@{k} {metrics[f'mean@{k}']:.3f}  Pass@{k} {metrics[f'pass@{k}']:.3f}"
            + (f"  skill {result['skill']}" if skill_path else "") + f"  ({result['seconds']:.0f}s)"
        )
        return result

    def _distill_round(self, skill: Skill, trajectories: list[dict], out: Path, seed: int, round_name: str) -> Skill:
        result = distill(skill, trajectories, self.analyst, self.config.distill, out, seed, round_name)
        s = result.summary()
        self.console.print(
            f"  distil {round_name}: {s['valid']}/{s['proposals']} valid proposals, {s['edits']} merged edits, "
            f"{s['conflicts']} conflicts, {s['dropped']} dropped -> {s['tag']}{'' if s['changed'] else ' (unchanged)'}"
        )
        return result.skill

    # ---- conditions -------------------------------------------------------------------------
    def baseline(self) -> dict:
        start = time.perf_counter()
        out = self._condition_dir("baseline")
        self._reset_weights()
        return self._finish("baseline", out, self._evaluate(out, None), start)

    def trace2skill(self) -> dict:
        cfg = self.config
        start = time.perf_counter()
        out = self._condition_dir("trace2skill")
        self._reset_weights()
        skill = self._initial_skill()
        skill_path = skill.save(out / SKILL_FILE)
        rollout_config = copy.deepcopy(cfg.rollout)
        rollout_config.skill = str(skill_path)
        for it in range(cfg.iterations):
            tasks = self.env.tasks("train", cfg.trace_tasks, derive_seed(cfg.seed, "trace2skill-tasks", it))
            result = rollout(self.policy, self.env, tasks, rollout_config, seed=derive_seed(cfg.seed, "trace2skill-decode", it))
            records = [{"iteration": it, **t.to_json()} for t in result.trajectories]
            with (out / "trajectories.jsonl").open("a") as f:
                f.writelines(json.dumps(r) + "\n" for r in records)
            skill = self._distill_round(skill, records, out, derive_seed(cfg.seed, "trace2skill-analyst", it), f"iter{it}")
        skill.save(skill_path)
        return self._finish("trace2skill", out, self._evaluate(out, skill_path), start, skill_path,
                            iterations=cfg.iterations)

    def es(self) -> dict:
        start = time.perf_counter()
        out = self._condition_dir("es", es_run=True)
        self._reset_weights()
        trainer = ESTrainer.start(self.config.train_config("es"), policy=self.policy, console=self.console)
        trainer.run()
        return self._finish("es", out, self._evaluate(out, None), start, es_steps=self.config.steps)

    def es_trace2skill(self) -> dict:
        cfg = self.config
        start = time.perf_counter()
        es_dir = Path(cfg.es_run) if cfg.es_run else self.dir / "es"
        found = checkpoints(es_dir) if es_dir.is_dir() else []
        if not found:
            raise ConfigError(f"es+trace2skill needs a finished ES run with a checkpoint in {es_dir} (run `esopt skill es` first)")
        from esopt.train.config import load_config

        es_config = load_config(es_dir / "config.yaml")
        if es_config.env.name != cfg.env.name or es_config.env.options != cfg.env.options:
            raise ConfigError(f"{es_dir} was trained on env {es_config.env.name} {es_config.env.options}, not "
                              f"{cfg.env.name} {cfg.env.options}")
        out = self._condition_dir("es+trace2skill")
        updates, path = found[-1]
        self.policy.load_master_weights(load_checkpoint_weights(path))
        expected = json.loads((path / "esopt.json").read_text())["fingerprint"]
        if self.policy.fingerprint() != expected:
            raise RuntimeError(f"checkpoint {path} does not match its recorded fingerprint")
        train_file = es_dir / "trajectories" / "train.jsonl"
        trajectories = [json.loads(x) for x in train_file.read_text().splitlines() if x.strip()] if train_file.exists() else []
        if not trajectories:
            raise ConfigError(f"{train_file} holds no training trajectories to distil from")
        limit = copy.deepcopy(cfg.distill)
        limit.max_trajectories = 0  # distil once from every completed ES trajectory
        result = distill(self._initial_skill(), trajectories, self.analyst, limit, out,
                         derive_seed(cfg.seed, "es+trace2skill-analyst"), "es")
        s = result.summary()
        self.console.print(f"  distil from {len(trajectories)} ES trajectories: {s['valid']}/{s['proposals']} valid, "
                           f"{s['edits']} merged edits, {s['conflicts']} conflicts -> {s['tag']}")
        skill_path = out / SKILL_FILE
        return self._finish("es+trace2skill", out, self._evaluate(out, skill_path), start, skill_path,
                            es_run=str(es_dir), es_steps=updates, trajectories=len(trajectories))

    def coevolve(self) -> dict:
        cfg = self.config
        start = time.perf_counter()
        out = self._condition_dir("coevolve", es_run=True)
        self._reset_weights()
        skill_path = self._initial_skill().save(out / SKILL_FILE)
        trainer = CoevolveTrainer.start(cfg.train_config("coevolve", str(skill_path)), policy=self.policy,
                                        console=self.console)
        trainer.experiment = self
        trainer.run()
        return self._finish("coevolve", out, self._evaluate(out, skill_path), start, skill_path,
                            es_steps=cfg.steps, skill_every=cfg.skill_every)

    def run(self, name: str) -> dict:
        if name not in CONDITIONS:
            raise ConfigError(f"unknown condition {name!r}; expected one of {', '.join(CONDITIONS)}")
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "config.yaml").write_text(self.config.to_yaml())
        self.console.rule(f"{LABELS[name]} ({self.config.env.name})")
        return getattr(self, name.replace("+", "_"))()


class CoevolveTrainer(ESTrainer):
    """The ES trainer with a skill update after every `skill_every` steps: the member-0 trajectories of
    those steps are distilled into a new SKILL.md, which the next rollouts read (the rollout loop
    re-reads a skill file when it changes)."""

    experiment: SkillExperiment

    def _train_step(self, step: int) -> dict[str, float]:
        values = super()._train_step(step)
        cfg = self.experiment.config
        if (step + 1) % cfg.skill_every == 0:
            first = step + 1 - cfg.skill_every
            train_file = self.run_dir / "trajectories" / "train.jsonl"
            records = [json.loads(x) for x in train_file.read_text().splitlines() if x.strip()] if train_file.exists() else []
            recent = [r for r in records if first <= r.get("step", -1) <= step]
            skill = Skill.load(self.config.rollout.skill)
            result = distill(skill, recent, self.experiment.analyst, cfg.distill, self.run_dir,
                             derive_seed(cfg.seed, "coevolve-analyst", step), f"step{step + 1}")
            s = result.summary()
            values.update({"skill/version": s["version"], "skill/valid_rate": s["valid_rate"],
                           "skill/edits": s["edits"], "skill/chars": s["chars"]})
        return values
