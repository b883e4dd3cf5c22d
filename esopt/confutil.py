"""Config dataclass helpers shared by every layer: help text on fields, dict/YAML round trips, typed values."""

from __future__ import annotations

import copy
import dataclasses
import os
import pathlib
import types
import typing
from typing import Any


class ConfigError(ValueError):
    """A bad configuration value; the CLI prints its message as a one-line error."""


class Config:
    """Base of every config dataclass. A config's rules live in one method, `check()`: its own fields, and
    how its sections combine (they are checked before it). `validate()` checks the whole tree, innermost
    first; the first bad value is a one-line ConfigError naming the field. The command-line parser, the
    trainers and env construction all call it, so a value set by a flag, in YAML or in Python code meets
    the same checks at the same point: before anything runs."""

    def check(self) -> None:
        """Raise ConfigError naming the first bad field of this config (not of its sections)."""

    def validate(self) -> None:
        validate_config(self)


def _sections(config: Any) -> list[Any]:
    return [
        value for value in (getattr(config, f.name) for f in dataclasses.fields(config))
        if dataclasses.is_dataclass(value) and not isinstance(value, type)
    ]


def validate_sections(config: Any) -> None:
    """Validate every section of `config`, not its own check (which may depend on values set later)."""
    for section in _sections(config):
        validate_config(section)


def validate_config(config: Any) -> None:
    """`Config.validate` for any config dataclass, also one that does not derive from Config (an env
    plugin's options; its `check()`, when it has one, is the rule)."""
    validate_sections(config)
    check = getattr(config, "check", None)
    if callable(check):
        check()


def is_int(x: Any) -> bool:
    """An int that is not a bool (YAML `true` must not pass as 1)."""
    return isinstance(x, int) and not isinstance(x, bool)


def is_number(x: Any) -> bool:
    """An int or a float, not a bool."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def opt(default: Any, help: str, **kwargs: Any) -> Any:
    """A dataclass field with help text (shown by the CLI). Mutable defaults are copied per instance."""
    if isinstance(default, (list, dict, set)) or dataclasses.is_dataclass(default):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata={"help": help, **kwargs})
    return dataclasses.field(default=default, metadata={"help": help, **kwargs})


def to_dict(cfg: Any) -> dict:
    return dataclasses.asdict(cfg)


def _unwrap_optional(hint: Any) -> tuple[Any, bool]:
    """(inner type, allows None) for `X | None` / Optional[X]."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(hint)) == 2:
            return args[0], True
    return hint, False


def coerce(value: Any, hint: Any, where: str) -> Any:
    """Convert a YAML or command-line value to the field's type, or raise ConfigError naming the field."""
    inner, nullable = _unwrap_optional(hint)
    if value is None or (nullable and isinstance(value, str) and value.lower() in ("none", "null")):
        if nullable:
            return None
        raise ConfigError(f"{where} must not be empty")
    try:
        if inner is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if inner is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if inner is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if inner is str:
            return str(value)
        if typing.get_origin(inner) is list or inner is list:
            if isinstance(value, str):
                return [v for v in value.split(",") if v]
            return list(value)
        if typing.get_origin(inner) is dict or inner is dict:
            if not isinstance(value, dict):
                raise ValueError
            return dict(value)
    except (TypeError, ValueError):
        name = getattr(inner, "__name__", str(inner))
        raise ConfigError(f"{where} expects {name}, got {value!r}") from None
    return value


def from_dict(cls: type, data: dict | None, where: str = "") -> Any:
    """Build dataclass `cls` from a (possibly nested) dict, rejecting unknown keys by name."""
    data = dict(data or {})
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    prefix = f"{where}." if where else ""
    if unknown:
        raise ConfigError(
            f"unknown config key(s) {', '.join(prefix + k for k in unknown)}; valid keys: {', '.join(sorted(names))}"
        )
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        value, hint = data[f.name], hints[f.name]
        if dataclasses.is_dataclass(hint):
            if not isinstance(value, dict):
                raise ConfigError(f"{prefix}{f.name} must be a mapping of options, got {value!r}")
            value = from_dict(hint, value, prefix + f.name)
        else:
            value = coerce(value, hint, prefix + f.name)
        kwargs[f.name] = value
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise ConfigError(f"{where or cls.__name__}: {e}") from None


def leaf_fields(cls: type, prefix: str = ""):
    """Yield (dotted path, type hint, help, default) for every non-dataclass field, depth first."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        path = prefix + f.name
        if dataclasses.is_dataclass(hint):
            yield from leaf_fields(hint, path + ".")
        else:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            yield path, hint, f.metadata.get("help", ""), default


def set_path(cfg: Any, path: str, value: Any) -> None:
    """Set a dotted attribute path on nested dataclasses, coercing to the field's type."""
    *parents, leaf = path.split(".")
    target = cfg
    for name in parents:
        target = getattr(target, name)
    hint = typing.get_type_hints(type(target))[leaf]
    setattr(target, leaf, coerce(value, hint, path))


def field_help(cls: type, name: str) -> str:
    for f in dataclasses.fields(cls):
        if f.name == name:
            return f.metadata.get("help", "")
    raise KeyError(name)


def cache_root() -> pathlib.Path:
    """Where esopt keeps what it computes once (converted models, dataset catalogues, reference solutions);
    override with ESOPT_CACHE."""
    return pathlib.Path(os.environ.get("ESOPT_CACHE", pathlib.Path.home() / ".cache" / "esopt"))


BUILTIN_CONFIGS = pathlib.Path(__file__).parent / "configs"
"""The YAML configs shipped inside the package (`esopt configs` lists them)."""


def builtin_configs() -> dict[str, pathlib.Path]:
    """Name (file stem) -> path of every config shipped with esopt."""
    return {path.stem: path for path in sorted(BUILTIN_CONFIGS.glob("*.yaml"))}


def resolve_config(spec: str | pathlib.Path) -> pathlib.Path:
    """The YAML file `spec` names: an existing path as given, else a built-in config by name
    ('sudoku_demo', 'sudoku_demo.yaml' or 'configs/sudoku_demo.yaml', the path inside a checkout), so
    the shipped configs work from any directory once esopt is installed."""
    path = pathlib.Path(spec)
    if path.is_file():
        return path
    builtin = builtin_configs().get(path.name.removesuffix(".yaml"))
    if builtin is not None and (path.parent == pathlib.Path(".") or path.parent.name == "configs"):
        return builtin
    raise ConfigError(f"config file not found: {spec} (built-in configs: {', '.join(builtin_configs())})")


def load_yaml(cls: type, path) -> Any:
    """Dataclass `cls` from a YAML file or built-in config name (None = all defaults); unknown keys and
    bad values in its sections are ConfigErrors. The file's own top-level rules are left to `validate()`,
    after the command line has had its say."""
    import yaml

    if path is None:
        return cls()
    file = resolve_config(path)
    try:
        data = yaml.safe_load(file.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of config options")
    config = from_dict(cls, data)
    validate_sections(config)
    return config
