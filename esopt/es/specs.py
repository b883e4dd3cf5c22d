"""Settings objects chosen by a `kind` name (noise kinds, optimizers): built from an ESConfig field or
from their `to_json()` record in history.jsonl."""

from __future__ import annotations

from typing import Any, Mapping, TypeVar

from esopt.confutil import ConfigError

T = TypeVar("T")


def spec_from_config(kinds: Mapping[str, type[T]], config: Any, field: str) -> T:
    """kinds[config.<field>].from_config(config); ConfigError naming es.<field> for an unknown kind."""
    kind = getattr(config, field)
    if kind not in kinds:
        raise ConfigError(f"es.{field}: unknown {field} {kind!r}; expected one of {', '.join(kinds)}")
    return kinds[kind].from_config(config)  # type: ignore[attr-defined]


def spec_from_json(kinds: Mapping[str, type[T]], record: Mapping[str, Any], what: str) -> T:
    """Rebuild a spec from {'kind': ..., **settings}; ValueError on an unknown kind or setting."""
    settings = dict(record)
    kind = settings.pop("kind", None)
    if kind not in kinds:
        raise ValueError(f"unknown {what} {kind!r}; expected one of {', '.join(kinds)}")
    try:
        return kinds[kind](**settings)
    except TypeError as e:
        raise ValueError(f"{what} {kind!r}: {e}") from None
