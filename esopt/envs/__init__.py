"""Environment registry: `make_env(name, options)` builds any registered env from plain options.

An env is registered once, as `NAME = "module:Class"`: built-in envs in `BUILTIN_ENVS` below, envs of
other installed packages as entry points in the `esopt.envs` group of their pyproject.toml:

    [project.entry-points."esopt.envs"]
    guess = "my_package.guess:GuessEnv"

`--env` also takes such a "module:Class" reference directly, for an env in any importable module that is
not registered at all. Classes are imported only when used, so optional dependencies stay optional and a
plugin that fails to import breaks only itself.
"""

from __future__ import annotations

import warnings
from importlib.metadata import EntryPoint, entry_points

from esopt.confutil import ConfigError, from_dict
from esopt.envs.base import Env, Episode, StepResult, Task

PLUGIN_GROUP = "esopt.envs"
BUILTIN_ENVS = {
    "math": "esopt.envs.math:MathEnv",
    "countdown": "esopt.envs.countdown:CountdownEnv",
    "docqa": "esopt.envs.docqa:DocQAEnv",
    "reasoning_gym": "esopt.envs.rgym:ReasoningGymEnv",
    "sudoku": "esopt.envs.sudoku:SudokuEnv",
    "web": "esopt.envs.web:WebEnv",
}


def _plugins() -> dict[str, EntryPoint]:
    """name -> entry point of every installed plugin env. A plugin never replaces a built-in env, and of
    two plugins with one name the first found wins; either way a warning names the one ignored."""
    found: dict[str, EntryPoint] = {}
    for point in entry_points(group=PLUGIN_GROUP):
        if point.name in BUILTIN_ENVS or point.name in found:
            warnings.warn(f"ignoring {_origin(point)}: an env named {point.name!r} already exists", stacklevel=2)
        else:
            found[point.name] = point
    return found


def env_names() -> list[str]:
    """Built-in and plugin env names (nothing is imported)."""
    return sorted(set(BUILTIN_ENVS) | set(_plugins()))


def _origin(point: EntryPoint) -> str:
    dist = getattr(point, "dist", None)
    return f"plugin {point.name!r} ({point.value}" + (f", from package {dist.name}" if dist is not None else "") + ")"


def _lookup(name: str) -> tuple[EntryPoint | None, str]:
    """(what to load for env `name`, where it comes from, for messages); None when nothing has that name."""
    if name in BUILTIN_ENVS:
        return EntryPoint(name, BUILTIN_ENVS[name], PLUGIN_GROUP), f"built-in env {name!r}"
    plugins = _plugins()
    if name in plugins:
        return plugins[name], _origin(plugins[name])
    if ":" in name:
        return EntryPoint(name, name, PLUGIN_GROUP), f"env reference {name!r}"
    return None, f"unknown env {name!r}"


def env_origin(name: str) -> str:
    """Where env `name` comes from, e.g. "built-in env 'sudoku'" or "plugin 'x' (mod:Cls, from package p)"."""
    return _lookup(name)[1]


def env_class(name: str) -> type[Env]:
    """The Env subclass registered as `name`, or named by a "module:Class" reference. Any failure is a
    one-line ConfigError naming the env and where it came from."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"env name must be a non-empty string, got {name!r}")
    point, origin = _lookup(name)
    if point is None:
        raise ConfigError(
            f"unknown env {name!r}; available: {', '.join(env_names())} (or a module:Class reference)"
        )
    try:
        cls = point.load()
    except Exception as e:  # a missing optional dependency, a broken plugin, a typo in a reference
        raise ConfigError(f"{origin} could not be loaded: {type(e).__name__}: {e}".splitlines()[0]) from None
    if not (isinstance(cls, type) and issubclass(cls, Env)):
        raise ConfigError(f"{origin} is {cls!r}, not a subclass of esopt.envs.Env")
    if not isinstance(getattr(cls, "name", None), str) or not cls.name:
        raise ConfigError(f"{origin}: {cls.__name__} must set a class attribute `name` (a non-empty string)")
    config_cls = getattr(cls, "Config", None)
    if not isinstance(config_cls, type) or not hasattr(config_cls, "__dataclass_fields__"):
        raise ConfigError(f"{origin}: {cls.__name__}.Config must be a dataclass of the env's options")
    return cls


def make_env(name: str, options: dict | None = None) -> Env:
    cls = env_class(name)
    config = from_dict(cls.Config, options or {}, where=f"env.{name}")
    return cls(config)


__all__ = ["Env", "Episode", "StepResult", "Task", "BUILTIN_ENVS", "PLUGIN_GROUP", "make_env", "env_class", "env_names", "env_origin"]
