"""Trace2Skill conditions: a skill document distilled from trajectories, placed in context, alone
and together with Agentic ESOpt. One experiment directory holds one subdirectory per condition:

- `baseline`        No Skill: the base model, evaluated as is.
- `trace2skill`     Trace2Skill: `iterations` rounds of (roll out `trace_tasks` train tasks with the
                    frozen model and the current skill -> distil a new skill), then evaluation with it.
- `es`              Agentic ESOpt + No Skill: an ES run (the ordinary trainer), evaluated without a skill.
- `es+trace2skill`  Agentic ESOpt + Trace2Skill: distil once from every saved training trajectory of
                    the `es` run, then evaluate the ES model with that skill.
- `coevolve`        Co-evolution: ES with the skill in context; every `skill_every` ES steps the skill
                    is distilled again from the trajectories of those steps; evaluated with the final skill.

Every condition is evaluated the same way: the same held-out tasks (eval_tasks, eval_seed), k =
`samples` episodes per task at `eval_temperature`, scored by esopt.train.evaluate (Mean@k of the
reward, Pass@k of success). Each condition directory holds `result.json`, `eval_trajectories.jsonl`
and, where a skill is used, `SKILL.md`, `skill_v<N>.md` and `distill_log.jsonl`; `report.md` in
the experiment directory puts the conditions side by side.

    esopt skill run --config configs/skill_math.yaml            # every condition, then the report
    esopt skill trace2skill --config configs/skill_math.yaml    # one condition
    esopt skill report runs/skill_math__0
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from esopt.confutil import ConfigError, opt
from esopt.envs import make_env
from esopt.es import derive_seed
from esopt.policy.base import Policy, load_checkpoint_weights
from esopt.rollout import rollout
from esopt.skills.analyst import Analyst, AnalystConfig, make_analyst
from esopt.skills.distill import SKILL_FILE, DistillConfig, distill, read_log
from esopt.skills.document import Skill, SkillError, seed_skill
from esopt.train.config import TrainConfig
from esopt.train.es_trainer import ESTrainer, checkpoints
from esopt.train.evaluate import evaluate
from esopt.runconfig import argument_parser, parse_config

CONDITIONS = ("baseline", "trace2skill", "es", "es+trace2skill", "coevolve")
LABELS = {
    "baseline": "No Skill",
    "trace2skill": "Trace2Skill",
    "es": "Agentic ESOpt + No Skill",
    "es+trace2skill": "Agentic ESOpt + Trace2Skill",
    "coevolve": "Co-evolution (ES <-> skill)",
}
RESULT_FILE = "result.json"


@dataclass
class SkillRunConfig(TrainConfig):
    """A TrainConfig (model, env, ES, rollout, steps, ... used by the ES conditions) plus the skill settings."""

    skill: str = opt("", "starting skill document of every distillation ('' = a two-section seed document)")
    analyst: AnalystConfig = opt(AnalystConfig(), "who proposes patches and how")
    distill: DistillConfig = opt(DistillConfig(), "hierarchical merge and skill limits")
    samples: int = opt(4, "k: episodes per held-out task for Mean@k / Pass@k")
    eval_temperature: float = opt(0.7, "sampling temperature of the Mean@k / Pass@k evaluation")
    iterations: int = opt(2, "trace2skill: rounds of (frozen-model rollouts -> distillation)")
    trace_tasks: int = opt(16, "trace2skill: train tasks rolled out per round")
    skill_every: int = opt(2, "coevolve: ES steps between skill updates")
    es_run: str = opt("", "es+trace2skill: the ES run directory to distil from ('' = <experiment>/es)")

    def validate(self) -> None:
        super().validate()
        for name in ("samples", "trace_tasks", "skill_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.iterations < 0:
            raise ConfigError(f"iterations must be >= 0, got {self.iterations}")
        if self.eval_temperature < 0:
            raise ConfigError(f"eval_temperature must be >= 0, got {self.eval_temperature}")
        if self.skill and not Path(self.skill).is_file():
            raise ConfigError(f"skill document not found: {self.skill}")

    @property
    def experiment_dir(self) -> Path:
        return Path(self.runs_dir) / (self.run_name or f"skill_{self.env.name}__{self.seed}")

    def train_config(self, run_name: str, skill: str = "") -> TrainConfig:
        """The plain TrainConfig of this experiment's ES runs (saved as their config.yaml, so
        `esopt replay` works on them). Every member-0 training episode is kept, for distillation."""
        config = TrainConfig(**{f.name: copy.deepcopy(getattr(self, f.name)) for f in dataclasses.fields(TrainConfig)})
        config.runs_dir = str(self.experiment_dir)
        config.run_name = run_name
        config.rollout.skill = skill
        config.trajectories_per_step = max(config.trajectories_per_step, config.tasks_per_step)
        return config


# ------------------------------------------------------------------------------------ experiment
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


# ---------------------------------------------------------------------------------------- report
def _fmt(x) -> str:
    return f"{x:.3f}" if isinstance(x, float) else ("-" if x is None else str(x))


def report(experiment_dir: str | Path) -> str:
    """A markdown table of every finished condition in `experiment_dir` (also written to report.md)."""
    root = Path(experiment_dir)
    results = []
    for name in CONDITIONS:
        path = root / name / RESULT_FILE
        if path.exists():
            results.append(json.loads(path.read_text()))
    if not results:
        raise ConfigError(f"{root} holds no finished condition (no */{RESULT_FILE})")
    k = results[0]["metrics"]["samples"]
    env = results[0]["env"]
    tasks = results[0]["metrics"]["tasks"]
    lines = [
        f"# Trace2Skill conditions: {env}",
        "",
        f"{tasks} held-out tasks, k = {k} episodes each. Mean@{k}: mean episode reward; Pass@{k}: a task "
        f"counts when any of its {k} episodes succeeded. Analyst validity: proposals that parsed into a "
        "patch valid against the skill (the rest were rejected and changed nothing).",
        "",
        f"| condition | Mean@{k} | Pass@{k} | success Mean@{k} | invalid actions | turns | skill | analyst valid | ES steps | skill document |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        m = r["metrics"]
        a = r.get("analyst") or {}
        valid = f"{a['valid']}/{a['proposals']}" if a.get("proposals") else "-"
        lines.append(
            f"| {r['label']} | {_fmt(m[f'mean@{k}'])} | {_fmt(m[f'pass@{k}'])} | {_fmt(m[f'success_mean@{k}'])} | "
            f"{_fmt(m['invalid_rate'])} | {m['mean_turns']:.2f} | {r['skill'] or '-'} | {valid} | "
            f"{r.get('es_steps', '-')} | {('`' + r['skill_file'] + '`') if r.get('skill_file') else '-'} |"
        )
    for r in results:
        if r.get("skill_file"):
            text = (root / r["skill_file"]).read_text()
            lines += ["", f"## Skill of {r['label']} ({r['skill']})", "", "```markdown", text.strip(), "```"]
            rejected = [x for x in read_log(root / r["condition"]) if x["kind"] == "proposal" and not x["valid"]]
            if rejected:
                reasons: dict[str, int] = {}
                for x in rejected:
                    reasons[x["reason"][:90]] = reasons.get(x["reason"][:90], 0) + 1
                lines += ["", "Rejected proposals by reason: " + "; ".join(
                    f"{why} ({n})" for why, n in sorted(reasons.items(), key=lambda kv: -kv[1])[:5])]
    text = "\n".join(lines) + "\n"
    (root / "report.md").write_text(text)
    return text


# ------------------------------------------------------------------------------------------- CLI
def _parse(prog: str, description: str, argv: list[str], conditions: bool) -> tuple[SkillRunConfig, argparse.Namespace]:
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--out", metavar="DIR", help="experiment directory (default: <runs_dir>/skill_<env>__<seed>)")
        parser.add_argument("--force", action="store_true", help="run a condition again even if its directory holds a result")
        if conditions:
            parser.add_argument("--conditions", default=",".join(CONDITIONS),
                                help=f"comma-separated conditions, run in this order (default: {','.join(CONDITIONS)})")

    def out_dir(config: SkillRunConfig, args: argparse.Namespace) -> None:
        if args.out:
            out = Path(args.out)
            config.runs_dir, config.run_name = str(out.parent), out.name

    return parse_config(argv, SkillRunConfig, prog, description, skip=("rollout.skill",),
                        add_arguments=add_arguments, adjust=out_dir)


def _run_conditions(names: list[str], argv: list[str], prog: str, description: str, conditions_flag: bool) -> int:
    config, args = _parse(prog, description, argv, conditions_flag)
    if conditions_flag:
        names = [c.strip() for c in args.conditions.split(",") if c.strip()]
    unknown = [c for c in names if c not in CONDITIONS]
    if unknown or not names:
        raise ConfigError(f"unknown condition(s) {', '.join(unknown) or '(none)'}; expected some of {', '.join(CONDITIONS)}")
    if "es+trace2skill" in names and "es" not in names[: names.index("es+trace2skill")]:
        es_dir = Path(config.es_run) if config.es_run else config.experiment_dir / "es"
        if not (es_dir.is_dir() and checkpoints(es_dir)):  # before the model is loaded
            raise ConfigError(f"es+trace2skill needs a finished ES run with a checkpoint in {es_dir} (run `esopt skill es` first)")
    experiment = SkillExperiment(config, force=args.force)
    for name in names:
        experiment.run(name)
    print(report(experiment.dir))
    print(f"experiment directory: {experiment.dir}  report: {experiment.dir / 'report.md'}")
    return 0


def _condition_command(name: str):
    def command(argv: list[str]) -> int:
        return _run_conditions([name], argv, f"esopt skill {name}", f"Run the {LABELS[name]} condition.", False)

    return command


def cmd_run(argv: list[str]) -> int:
    return _run_conditions([], argv, "esopt skill run", "Run several conditions into one experiment directory.", True)


def cmd_report(argv: list[str]) -> int:
    parser = argument_parser("esopt skill report", "Mean@k / Pass@k of every condition side by side.")
    parser.add_argument("experiment_dir")
    print(report(parser.parse_args(argv).experiment_dir))
    return 0


SUBCOMMANDS = {**{name: _condition_command(name) for name in CONDITIONS}, "run": cmd_run, "report": cmd_report}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    usage = f"usage: esopt skill {{{','.join(SUBCOMMANDS)}}} [options]   (esopt skill COMMAND --help for options)"
    if not argv or argv[0] in ("-h", "--help"):
        print(usage)
        return 0
    if argv[0] not in SUBCOMMANDS:
        raise ConfigError(f"unknown subcommand esopt skill {argv[0]!r}; expected one of {', '.join(SUBCOMMANDS)}")
    try:
        return SUBCOMMANDS[argv[0]](argv[1:])
    except SkillError as e:  # a bad skill document given in the config
        raise ConfigError(str(e)) from None
