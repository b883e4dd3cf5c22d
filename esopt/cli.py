"""`esopt` command line: train, eval, replay, envs. Thin: it parses, then calls esopt.train."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from esopt import __version__
from esopt.confutil import BUILTIN_CONFIGS, ConfigError, leaf_fields
from esopt.runconfig import parse_config


# ---- train ---------------------------------------------------------------------------------------
def cmd_train(argv: list[str]) -> int:
    from rich.console import Console

    from esopt.train.config import TrainConfig
    from esopt.train.es_trainer import ESTrainer
    from esopt.train.report import print_summary

    config, args = parse_config(
        argv, TrainConfig, "esopt train", "Fine-tune a model with evolution strategies.",
        add_arguments=lambda parser: parser.add_argument(
            "--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR (its saved config is used)"
        ),
    )
    console = Console()
    if args.resume:
        trainer = ESTrainer.resume(args.resume, console=console)
    else:
        console.rule("resolved config")
        console.print(config.to_yaml(), highlight=False)
        trainer = ESTrainer.start(config, console=console)
    print_summary(console, trainer.run(), f"esopt: {trainer.config.env.name} / {trainer.config.method}")
    return 0


# ---- eval ----------------------------------------------------------------------------------------
def _model_from_spec(spec: str, model):
    """A ModelConfig for `spec`: a run directory (its newest checkpoint), a model directory or 'default'."""
    import dataclasses

    from esopt.train.es_trainer import checkpoints

    path = Path(spec)
    if (path / "config.yaml").exists() and (path / "checkpoints").is_dir():
        found = checkpoints(path)
        if not found:
            raise ConfigError(f"run directory {path} has no complete checkpoint")
        spec = str(found[-1][1])
    return dataclasses.replace(model, path=spec)


def _print_eval(console, label: str, report: dict) -> None:
    from esopt.envs.metrics import wilson_interval

    n, k = report["tasks"], report["samples"]
    console.print(f"[bold]{label}[/]  ({n} tasks x {k} sample{'s' if k > 1 else ''})")
    for key, value in report.items():
        if key in ("per_task_success", "per_task_invalid", "answers", "by_category") or key.endswith("_ci95"):
            continue
        if key in (f"success_mean@{k}", "trivial_success", "invalid_episodes") or key.startswith("pass@"):
            low, high = report[f"{key}_ci95"] if f"{key}_ci95" in report else wilson_interval(value * n, n)
            console.print(f"{key:>20}: {value:.4f}  95% CI [{low:.3f}, {high:.3f}]")
        else:
            console.print(f"{key:>20}: {value:.4f}" if isinstance(value, float) else f"{key:>20}: {value}")
    for category, rate in report.get("by_category", {}).items():
        low, high = rate["ci95"]
        console.print(f"{'success/' + category:>20}: {rate['success']:.4f}  95% CI [{low:.3f}, {high:.3f}]  n = {rate['n']}")
    shown = ", ".join(f"{answer or '(none)'}: {count}" for answer, count in list(report["answers"].items())[:8])
    console.print(f"{'answers':>20}: {shown}")


def _eval_config(path):
    """`esopt eval --config`: an eval config, or a training run's config (ES, GRPO or PPO, built in or a run
    directory's config.yaml); from a training config eval takes the model, the env (with eval_env_options) and
    the rollout that run's held-out evaluations use (greedy under eval_greedy), and keeps its own tasks, split
    and seed."""
    import yaml

    from esopt.baselines.grpo import GRPOConfig
    from esopt.baselines.ppo import PPOConfig
    from esopt.confutil import load_yaml, resolve_config
    from esopt.train.config import TrainConfig
    from esopt.train.es_trainer import eval_rollout_config
    from esopt.train.evaluate import EvalConfig

    try:
        data = yaml.safe_load(resolve_config(path).read_text()) if path is not None else {}
    except yaml.YAMLError:
        data = None  # load_yaml says what is wrong with it
    keys = set(data) if isinstance(data, dict) else set()
    kinds = [EvalConfig, TrainConfig, GRPOConfig, PPOConfig]
    names = {kind: {f.name for f in dataclasses.fields(kind)} for kind in kinds}
    # the config whose keys the file uses; with a typo, the one it is closest to names it
    kind = next((k for k in kinds if keys <= names[k]), None) or max(kinds, key=lambda k: len(keys & names[k]))
    run = load_yaml(kind, path)
    if kind is EvalConfig:
        return run
    rollout = eval_rollout_config(run) if kind is TrainConfig else run.rollout
    return EvalConfig(model=run.model, env=run.eval_env_section(), rollout=rollout)


def cmd_eval(argv: list[str]) -> int:
    from rich.console import Console

    from esopt.envs import make_env
    from esopt.envs.metrics import paired_difference
    from esopt.policy import load_policy
    from esopt.train.evaluate import EvalConfig, evaluate

    config, args = parse_config(
        argv, EvalConfig, "esopt eval",
        "Evaluate a model or checkpoint on an env; with --compare, two of them on the same tasks (paired). "
        "--config may also name a training config (ES or GRPO/PPO, or a run's config.yaml): eval then uses its "
        "model, env and held-out evaluation rollout.",
        add_arguments=lambda parser: parser.add_argument(
            "--compare", nargs=2, metavar=("A", "B"),
            help="evaluate A and B (run directories, model directories or 'default') on the same tasks and report "
            "the paired difference B - A of per-task success with its 95%% bootstrap interval",
        ),
        load=_eval_config,
    )
    env = make_env(config.env.name, config.env.options)
    tasks = env.tasks(config.split, config.tasks, config.seed)
    console = Console()
    specs = args.compare or [config.model.path]
    reports = []
    for i, spec in enumerate(specs):
        out = config.out if not args.compare else (f"{config.out}.{'AB'[i]}.jsonl" if config.out else None)
        policy = load_policy(_model_from_spec(spec, config.model))
        reports.append(evaluate(policy, env, tasks, config.rollout, config.samples, config.seed, out))
        del policy
        _print_eval(console, spec if args.compare else f"{spec} on {env.name}/{config.split}", reports[-1])
    if args.compare:
        for measure in ("success", "invalid"):
            d = paired_difference(reports[1][f"per_task_{measure}"], reports[0][f"per_task_{measure}"])
            console.print(
                f"[bold]paired difference B - A[/] of {'success' if measure == 'success' else 'invalid episodes'} "
                f"over the same {d['n']} tasks: {d['diff']:+.4f}  95% CI [{d['low']:+.3f}, {d['high']:+.3f}]  "
                f"(sign-flip p = {d['p']:.3g})"
            )
    return 0


# ---- replay --------------------------------------------------------------------------------------
def cmd_replay(argv: list[str]) -> int:
    from esopt.policy import load_policy
    from esopt.runconfig import argument_parser
    from esopt.train.config import load_config
    from esopt.train.es_trainer import read_run_history

    parser = argument_parser("esopt replay", "Rebuild a run's weights from the base model and its history.jsonl.")
    parser.add_argument("run_dir", help="the run directory")
    parser.add_argument("--out", required=True, help="directory to save the rebuilt model in")
    parser.add_argument("--steps", type=int, help="replay only the first k updates (default: all)")
    args = parser.parse_args(argv)
    run_dir = Path(args.run_dir)
    if not (run_dir / "history.jsonl").exists():
        raise ConfigError(f"{run_dir} has no history.jsonl")
    config = load_config(run_dir / "config.yaml")
    history = read_run_history(run_dir)[: args.steps]
    # The fp32 master is the same on every backend (the vLLM backend builds it as HFPolicy does), so a
    # replay needs no inference engine: the HF backend rebuilds the weights of a vLLM run too.
    policy = load_policy(dataclasses.replace(config.model, backend="hf"))
    for update in history:
        policy.apply(update)
    policy.save(args.out)
    print(f"replayed {len(history)} updates; fingerprint {policy.fingerprint()}; saved to {args.out}")
    return 0


# ---- envs ----------------------------------------------------------------------------------------
def cmd_envs(argv: list[str]) -> int:
    from esopt.envs import BUILTIN_ENVS, env_class, env_names, env_origin
    from esopt.runconfig import argument_parser

    argument_parser("esopt envs", "List environments and their options.").parse_args(argv)
    for name in env_names():
        try:
            cls = env_class(name)
        except ConfigError as e:  # a missing optional dependency, a broken plugin: one line, the others still listed
            print(f"{name}: unavailable ({e})")
            continue
        print(f"{name}:" + ("" if name in BUILTIN_ENVS else f" {env_origin(name)}"))
        for path, _, help_text, default in leaf_fields(cls.Config):
            print(f"  --env.{path} (default {default!r}): {help_text}")
        for line in cls.listing():
            print(f"  {line}")
    return 0


def cmd_configs(argv: list[str]) -> int:
    from esopt.confutil import builtin_configs

    from esopt.runconfig import argument_parser

    argument_parser("esopt configs", "List the configs shipped with esopt (use one as --config NAME).").parse_args(argv)
    configs = builtin_configs()
    for name, path in configs.items():
        first = path.read_text().splitlines()[:1]
        summary = first[0].lstrip("# ").strip() if first and first[0].startswith("#") else ""
        print(f"{name:<20} {summary[:100]}")
    print(f"({len(configs)} built-in configs, in {BUILTIN_CONFIGS}; e.g. esopt train --config sudoku_demo)")
    return 0


def cmd_ahd(argv: list[str]) -> int:
    from esopt.ahd.cli import main

    return main(argv)


# ---- gradient baselines and the comparison (thin wrappers) ---------------------------------------
def cmd_grpo(argv: list[str]) -> int:
    from esopt.baselines.grpo import main

    return main(argv)


def cmd_ppo(argv: list[str]) -> int:
    from esopt.baselines.ppo import main

    return main(argv)


def cmd_compare(argv: list[str]) -> int:
    from esopt.experiments.compare import main

    return main(argv)


def cmd_skill(argv: list[str]) -> int:
    from esopt.experiments.skill.cli import main

    return main(argv)


def cmd_landscape(argv: list[str]) -> int:
    from esopt.train.landscape import main

    return main(argv)


COMMANDS = {
    "train": cmd_train,
    "eval": cmd_eval,
    "replay": cmd_replay,
    "envs": cmd_envs,
    "configs": cmd_configs,
    "ahd": cmd_ahd,
    "grpo": cmd_grpo,
    "ppo": cmd_ppo,
    "compare": cmd_compare,
    "skill": cmd_skill,
    "landscape": cmd_landscape,
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--version":
        print(f"esopt {__version__}")
        return 0
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(f"usage: esopt {{{','.join(COMMANDS)}}} [options]   (esopt COMMAND --help for options; esopt --version)")
        if argv and argv[0] not in ("-h", "--help"):
            print(f"esopt: error: unknown command {argv[0]!r}", file=sys.stderr)
            return 2
        return 0
    try:
        return COMMANDS[argv[0]](argv[1:])
    except ConfigError as e:
        print(f"esopt: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("esopt: interrupted (a run resumes with: esopt train --resume RUN_DIR)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
