"""`esopt skill`: run one condition, several (`run`), or print the report (`report`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from esopt.confutil import ConfigError
from esopt.experiments.skill.conditions import SkillExperiment
from esopt.experiments.skill.config import CONDITIONS, LABELS, SkillRunConfig
from esopt.experiments.skill.report import report
from esopt.runconfig import argument_parser, parse_config
from esopt.skills.document import SkillError
from esopt.train.es_trainer import checkpoints


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
