"""What every run's config shares, and the one way a command line becomes a config.

`RunConfig` is the base of every command's config (ES `TrainConfig`, GRPO/PPO `PGConfig`, AHD
`AHDConfig`, `CompareConfig`): the run seed, where its run directory goes, how that directory is
named and created, and the resolved config saved in it as config.yaml. `EnvRunConfig` adds the env.

`parse_config` is the one parser: `--config FILE` (YAML), then one flag per config field
(`--es.sigma 0.01`), `--env NAME` and that env's `--env.*` options; flags override the YAML; the
result is validated before anything runs, so a bad value fails at parse time with a one-line
ConfigError, as does an unknown flag.
"""

from __future__ import annotations

import argparse
import functools
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, ClassVar

import yaml

from esopt.confutil import Config, ConfigError, is_int, leaf_fields, load_yaml, opt, set_path, to_dict
from esopt.machine import write_record as write_machine_record


@dataclass
class EnvSection(Config):
    """The task environment of a run: its registered name and its options."""

    name: str = opt("sudoku", "environment name (`esopt envs` lists them)")
    options: dict = opt({}, "env-specific options, e.g. size and empty_cells for sudoku (`esopt envs` lists them)")


@dataclass
class RunConfig(Config):
    """Fields and behaviour every run shares: seed, run directory (runs_dir / run_name), config.yaml."""

    seed: int = opt(0, "run seed: everything random in the run derives from it")
    runs_dir: str = opt("runs", "parent directory of run directories")
    run_name: str | None = opt(None, "run directory name (default: <env or task>__<method>__<seed>__<start time>)")

    run_marker: ClassVar[str] = "config.yaml"
    """A file whose presence means a directory already holds a run of this kind."""

    def run_label(self) -> str:
        """The default run directory name's first part, e.g. 'sudoku__agentic-esopt'."""
        raise NotImplementedError

    def existing_run_hint(self, run_dir: Path) -> str:
        return "pick another --run_name"

    def check(self) -> None:
        if not is_int(self.seed):
            raise ConfigError(f"seed must be an integer, got {self.seed!r}")
        if not self.runs_dir:
            raise ConfigError("runs_dir must not be empty")
        if self.run_name is not None and (not self.run_name or Path(self.run_name).name != self.run_name):
            raise ConfigError(f"run_name must be a plain directory name, got {self.run_name!r}")

    def run_dir(self) -> Path:
        name = self.run_name or f"{self.run_label()}__{self.seed}__{datetime.now().strftime('%Y%m%d-%H%M%S')}"
        return Path(self.runs_dir) / name

    def create_run_dir(self) -> Path:
        """A new run directory holding this config as config.yaml and the machine record (esopt.machine);
        ConfigError if it already holds a run."""
        run_dir = self.run_dir()
        if (run_dir / self.run_marker).exists():
            raise ConfigError(f"run directory {run_dir} already holds a run; {self.existing_run_hint(run_dir)}")
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(self.to_yaml())
        write_machine_record(run_dir)
        return run_dir

    def to_yaml(self) -> str:
        return yaml.safe_dump(to_dict(self), sort_keys=False)


@dataclass
class EnvRunConfig(RunConfig):
    """A run on one env (ES, GRPO/PPO, compare)."""

    env: EnvSection = opt(EnvSection(), "the task environment")

    def check(self) -> None:
        from esopt.envs import make_env

        super().check()
        make_env(self.env.name, self.env.options)  # validates the env options


# ---- the command line -----------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    """argparse, but a bad command line is a ConfigError (one line, like every other config error)."""

    def error(self, message: str):  # type: ignore[override]
        raise ConfigError(f"{message} (`{self.prog} --help` lists the options)")


def argument_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """An argparse parser whose errors are one-line ConfigErrors."""
    return _Parser(prog=prog, description=description)


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value given to `flag` in argv (`--flag V` or `--flag=V`), the last one wins; None if absent."""
    found = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            found = argv[i + 1]
        elif arg.startswith(flag + "="):
            found = arg.split("=", 1)[1]
    return found


def _literal(help_text: str) -> str:
    """Help text as argparse prints it: it %-formats help strings, so a literal % is written %%."""
    return help_text.replace("%", "%%")


def add_config_flags(parser: argparse.ArgumentParser, cls: type, prefix: str = "", skip: tuple[str, ...] = ()) -> None:
    """One `--<prefix><path>` flag per leaf field of `cls` (and a dashed alias), except paths under `skip`."""
    for path, _, help_text, default in leaf_fields(cls):
        if path.startswith(skip):
            continue
        names = [f"--{prefix}{path}"] + ([f"--{prefix}{path.replace('_', '-')}"] if "_" in path else [])
        parser.add_argument(
            *names, dest=f"cfg:{prefix}{path}", default=argparse.SUPPRESS, metavar="V", help=_literal(f"{help_text} (default: {default})")
        )


def add_env_flags(parser: argparse.ArgumentParser, env_name: str) -> None:
    """`--env NAME` and one `--env.<option>` flag per option of env `env_name`."""
    from esopt.envs import env_class

    parser.add_argument("--env", dest="env_name", default=argparse.SUPPRESS, metavar="NAME", help="environment name (`esopt envs` lists them)")
    try:
        cls = env_class(env_name)
    except ConfigError:
        return  # reported when the config is validated
    for path, _, help_text, default in leaf_fields(cls.Config):
        parser.add_argument(
            f"--env.{path}", dest=f"env:{path}", default=argparse.SUPPRESS, metavar="V", help=_literal(f"[{env_name}] {help_text} (default: {default})")
        )


def env_overrides(args: argparse.Namespace) -> dict:
    """The `--env.*` options given on the command line."""
    return {key[4:]: value for key, value in vars(args).items() if key.startswith("env:")}


def apply_overrides(config: Any, args: argparse.Namespace, prefix: str = "") -> None:
    """Set every `--<prefix><path>` flag given on the command line on `config` (typed, per field)."""
    for key, value in vars(args).items():
        if key.startswith("cfg:" + prefix):
            set_path(config, key[4 + len(prefix) :], value)


def parse_config(
    argv: list[str],
    cls: type,
    prog: str,
    description: str,
    skip: tuple[str, ...] = (),
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
    adjust: Callable[[Any, argparse.Namespace], None] | None = None,
    load: Callable[[Any], Any] | None = None,
) -> tuple[Any, argparse.Namespace]:
    """(validated config, parsed arguments) of a command whose config is dataclass `cls`: `--config`
    YAML, then field flags (except paths under `skip`), env choice and env options; `add_arguments`
    adds the command's own arguments, `adjust(config, args)` applies them before validation; `load(path)`
    reads `--config` into a `cls` where the file may hold another config (default: a `cls` YAML)."""
    if load is None:
        load = functools.partial(load_yaml, cls)
    has_env = any(path.startswith("env.") for path, *_ in leaf_fields(cls))
    parser = argument_parser(prog, description)
    parser.add_argument("--config", help="YAML config: a built-in name (`esopt configs` lists them) or a path; flags override it")
    config_file = flag_value(argv, "--config")
    if has_env:
        default_env = cls().env.name
        if config_file:
            try:
                default_env = load(config_file).env.name
            except ConfigError:
                pass  # reported when the config is loaded below
        add_env_flags(parser, flag_value(argv, "--env") or default_env)
    add_config_flags(parser, cls, skip=("env.",) + tuple(skip) if has_env else tuple(skip))
    if add_arguments is not None:
        add_arguments(parser)
    args = parser.parse_args(argv)
    config = load(args.config)
    if has_env:
        if hasattr(args, "env_name") and args.env_name != config.env.name:
            config.env.name = args.env_name
            config.env.options = {}
        config.env.options.update(env_overrides(args))
    apply_overrides(config, args)
    if adjust is not None:
        adjust(config, args)
    config.validate()
    return config, args
