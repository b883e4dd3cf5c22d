"""Environment registry: `make_env(name, options)` builds any registered env from plain options."""

from __future__ import annotations

import importlib

from esopt.confutil import ConfigError, from_dict
from esopt.envs.base import Env, Episode, StepResult, Task

# name -> module that registers it; imported lazily so optional dependencies stay optional.
_BUILTIN = {
    "math": "esopt.envs.math",
    "countdown": "esopt.envs.countdown",
    "docqa": "esopt.envs.docqa",
    "reasoning_gym": "esopt.envs.rgym",
    "sudoku": "esopt.envs.sudoku",
    "web": "esopt.envs.web",
}
_REGISTRY: dict[str, type[Env]] = {}


def register_env(cls: type[Env]) -> type[Env]:
    """Class decorator: make `cls` available as `make_env(cls.name)`."""
    _REGISTRY[cls.name] = cls
    return cls


def env_names() -> list[str]:
    return sorted(set(_BUILTIN) | set(_REGISTRY))


def env_class(name: str) -> type[Env]:
    if name not in _REGISTRY and name in _BUILTIN:
        importlib.import_module(_BUILTIN[name])
    if name not in _REGISTRY:
        raise ConfigError(f"unknown env {name!r}; available: {', '.join(env_names())}")
    return _REGISTRY[name]


def make_env(name: str, options: dict | None = None) -> Env:
    cls = env_class(name)
    config = from_dict(cls.Config, options or {}, where=f"env.{name}")
    return cls(config)


__all__ = ["Env", "Episode", "StepResult", "Task", "register_env", "make_env", "env_class", "env_names"]
