"""`esopt` command line: train, eval, replay, envs. Thin: it parses, then calls esopt.train."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from esopt.confutil import BUILTIN_CONFIGS, ConfigError, leaf_fields, set_path

CONFIG_HELP = "YAML config: a built-in name (`esopt configs` lists them) or a path; flags override it"


def _add_config_flags(parser: argparse.ArgumentParser, cls: type, prefix: str, skip: tuple[str, ...] = ()) -> None:
    for path, hint, help_text, default in leaf_fields(cls):
        if path in skip:
            continue
        parser.add_argument(
            f"--{prefix}{path}",
            dest=f"cfg:{prefix}{path}",
            default=argparse.SUPPRESS,
            metavar="V",
            help=f"{help_text} (default: {default})",
        )


def _env_name_from_argv(argv: list[str], default: str) -> str:
    for i, arg in enumerate(argv):
        if arg == "--env" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--env="):
            return arg.split("=", 1)[1]
    return default


def _add_env_flags(parser: argparse.ArgumentParser, env_name: str) -> None:
    from esopt.envs import env_class

    parser.add_argument("--env", dest="env_name", default=argparse.SUPPRESS, metavar="NAME", help="environment name (`esopt envs` lists them)")
    try:
        cls = env_class(env_name)
    except ConfigError:
        return  # reported when the config is validated
    for path, _, help_text, default in leaf_fields(cls.Config):
        parser.add_argument(
            f"--env.{path}", dest=f"env:{path}", default=argparse.SUPPRESS, metavar="V", help=f"[{env_name}] {help_text} (default: {default})"
        )


def _apply_overrides(config, args: argparse.Namespace, prefix: str = "") -> None:
    for key, value in vars(args).items():
        if key.startswith("cfg:"):
            set_path(config, key[4:][len(prefix):], value)


def _env_overrides(args: argparse.Namespace) -> dict:
    return {key[4:]: value for key, value in vars(args).items() if key.startswith("env:")}


# ---- train ---------------------------------------------------------------------------------------
def _train_parser(argv: list[str]) -> argparse.ArgumentParser:
    from esopt.train.config import TrainConfig, load_config

    parser = argparse.ArgumentParser(prog="esopt train", description="Fine-tune a model with evolution strategies.")
    parser.add_argument("--config", help=CONFIG_HELP)
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR (its saved config is used)")
    config_file = None
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            config_file = argv[i + 1]
        elif arg.startswith("--config="):
            config_file = arg.split("=", 1)[1]
    default_env = TrainConfig().env.name
    if config_file:
        try:
            default_env = load_config(config_file).env.name
        except ConfigError:
            pass  # reported below
    _add_env_flags(parser, _env_name_from_argv(argv, default_env))
    _add_config_flags(parser, TrainConfig, "", skip=("env.name", "env.options"))
    return parser


def cmd_train(argv: list[str]) -> int:
    from rich.console import Console

    from esopt.train.config import load_config
    from esopt.train.es_trainer import ESTrainer
    from esopt.train.report import print_summary

    args = _train_parser(argv).parse_args(argv)
    console = Console()
    if args.resume:
        trainer = ESTrainer.resume(args.resume, console=console)
    else:
        config = load_config(args.config)
        if hasattr(args, "env_name") and args.env_name != config.env.name:
            config.env.name = args.env_name
            config.env.options = {}
        config.env.options.update(_env_overrides(args))
        _apply_overrides(config, args)
        config.validate()
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
        if key in ("per_task_success", "per_task_invalid", "answers") or key.endswith("_ci95"):
            continue
        if key in (f"success_mean@{k}", "trivial_success", "invalid_episodes") or key.startswith(("pass@", "success/")):
            low, high = report[f"{key}_ci95"] if f"{key}_ci95" in report else wilson_interval(value * n, n)
            console.print(f"{key:>20}: {value:.4f}  95% CI [{low:.3f}, {high:.3f}]")
        else:
            console.print(f"{key:>20}: {value:.4f}" if isinstance(value, float) else f"{key:>20}: {value}")
    shown = ", ".join(f"{answer or '(none)'}: {count}" for answer, count in list(report["answers"].items())[:8])
    console.print(f"{'answers':>20}: {shown}")


def cmd_eval(argv: list[str]) -> int:
    from rich.console import Console

    from esopt.envs import make_env
    from esopt.envs.base import SPLITS
    from esopt.envs.metrics import paired_difference
    from esopt.policy import load_policy
    from esopt.policy.hf import ModelConfig
    from esopt.rollout import RolloutConfig
    from esopt.train.evaluate import evaluate

    parser = argparse.ArgumentParser(
        prog="esopt eval",
        description="Evaluate a model or checkpoint on an env; with --compare, two of them on the same tasks (paired).",
    )
    parser.add_argument("--tasks", type=int, default=32, help="number of tasks (default: 32)")
    parser.add_argument("--split", default="eval", choices=SPLITS, help="task split: train, val (for choosing settings) or eval (held out; default)")
    parser.add_argument("--seed", type=int, default=0, help="task and decoding seed (default: 0)")
    parser.add_argument("--samples", type=int, default=1, help="k episodes per task for Mean@k / Pass@k (use temperature > 0)")
    parser.add_argument("--out", help="write trajectories (JSONL) here")
    parser.add_argument(
        "--compare", nargs=2, metavar=("A", "B"),
        help="evaluate A and B (run directories, model directories or 'default') on the same tasks and report "
        "the paired difference B - A of per-task success with its 95%% bootstrap interval",
    )
    _add_env_flags(parser, _env_name_from_argv(argv, "sudoku"))
    _add_config_flags(parser, ModelConfig, "model.")
    _add_config_flags(parser, RolloutConfig, "rollout.")
    args = parser.parse_args(argv)
    model, rollout_config = ModelConfig(), RolloutConfig()
    for key, value in vars(args).items():
        if key.startswith("cfg:model."):
            set_path(model, key[len("cfg:model."):], value)
        elif key.startswith("cfg:rollout."):
            set_path(rollout_config, key[len("cfg:rollout."):], value)
    if args.tasks < 1 or args.samples < 1:
        raise ConfigError("--tasks and --samples must be >= 1")
    env = make_env(getattr(args, "env_name", "sudoku"), _env_overrides(args))
    tasks = env.tasks(args.split, args.tasks, args.seed)
    console = Console()
    specs = args.compare or [model.path]
    reports = []
    for i, spec in enumerate(specs):
        out = args.out if not args.compare else (f"{args.out}.{'AB'[i]}.jsonl" if args.out else None)
        policy = load_policy(_model_from_spec(spec, model))
        reports.append(evaluate(policy, env, tasks, rollout_config, args.samples, args.seed, out))
        del policy
        _print_eval(console, spec if args.compare else f"{spec} on {env.name}/{args.split}", reports[-1])
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
    from esopt.es import read_history
    from esopt.policy import load_policy
    from esopt.train.config import load_config

    parser = argparse.ArgumentParser(prog="esopt replay", description="Rebuild a run's weights from the base model and its history.jsonl.")
    parser.add_argument("run_dir", help="the run directory")
    parser.add_argument("--out", required=True, help="directory to save the rebuilt model in")
    parser.add_argument("--steps", type=int, help="replay only the first k updates (default: all)")
    args = parser.parse_args(argv)
    run_dir = Path(args.run_dir)
    if not (run_dir / "history.jsonl").exists():
        raise ConfigError(f"{run_dir} has no history.jsonl")
    config = load_config(run_dir / "config.yaml")
    history = read_history(run_dir / "history.jsonl")[: args.steps]
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

    argparse.ArgumentParser(prog="esopt envs", description="List environments and their options.").parse_args(argv)
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

    argparse.ArgumentParser(
        prog="esopt configs", description="List the configs shipped with esopt (use one as --config NAME)."
    ).parse_args(argv)
    configs = builtin_configs()
    for name, path in configs.items():
        first = path.read_text().splitlines()[:1]
        summary = first[0].lstrip("# ").strip() if first and first[0].startswith("#") else ""
        print(f"{name:<20} {summary[:100]}")
    print(f"({len(configs)} built-in configs, in {BUILTIN_CONFIGS}; e.g. esopt train --config sudoku_demo)")
    return 0


def cmd_ahd(argv: list[str]) -> int:
    from esopt.ahd.loops import main

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
    from esopt.experiments.skill import main

    return main(argv)


def cmd_landscape(argv: list[str]) -> int:
    from esopt.train.landscape import main

    return main(argv, lambda parser: _add_env_flags(parser, _env_name_from_argv(argv, "sudoku")), _env_overrides)


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
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(f"usage: esopt {{{','.join(COMMANDS)}}} [options]   (esopt COMMAND --help for options)")
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
