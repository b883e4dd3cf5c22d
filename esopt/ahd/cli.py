"""`esopt ahd run | report | tasks`."""

from __future__ import annotations

import sys

from esopt.ahd.config import AHDConfig
from esopt.ahd.loops import run_ahd
from esopt.confutil import ConfigError
from esopt.runconfig import argument_parser, parse_config


def cmd_run(argv: list[str]) -> int:
    from rich.console import Console

    # es.population is --population; every member writes its own proposal, so no antithetic pairs.
    config, _ = parse_config(argv, AHDConfig, "esopt ahd run", "Run an AHD method for a proposal budget.",
                             skip=("es.population", "es.antithetic"))
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

    parser = argument_parser("esopt ahd report", "Compare AHD runs per task.")
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    parser.add_argument("--plot", metavar="PNG", help="also write best-so-far curves of every run here")
    args = parser.parse_args(argv)
    print(compare_runs(args.run_dirs, plot=args.plot))
    return 0


def cmd_tasks(argv: list[str]) -> int:
    from esopt.ahd.tasks import get_task, task_names

    argument_parser("esopt ahd tasks", "List AHD tasks.").parse_args(argv)
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
        raise ConfigError(f"unknown subcommand esopt ahd {argv[0]!r}; expected one of {', '.join(SUBCOMMANDS)}")
    return SUBCOMMANDS[argv[0]](argv[1:])
