"""Noise kinds behind one interface (`Noise`): full, table and low-rank. A new kind is one module here
and one entry in NOISE_KINDS."""

from __future__ import annotations

from typing import Any, Mapping

from esopt.es.noise.base import Noise
from esopt.es.noise.full import CHUNK_NUMEL, FullNoise, tensor_noise
from esopt.es.noise.lowrank import (
    LOWRANK_VECTORS,
    LowRankNoise,
    is_matrix,
    lowrank_direction,
    lowrank_factors,
    lowrank_perturbation,
    stacked_factors,
)
from esopt.es.noise.table import DEFAULT_TABLE_SIZE, TableNoise, noise_table, table_noise
from esopt.es.specs import spec_from_config, spec_from_json

__all__ = [
    "CHUNK_NUMEL",
    "DEFAULT_TABLE_SIZE",
    "LOWRANK_VECTORS",
    "NOISE_KINDS",
    "FullNoise",
    "LowRankNoise",
    "Noise",
    "TableNoise",
    "is_matrix",
    "lowrank_direction",
    "lowrank_factors",
    "lowrank_perturbation",
    "noise_from_config",
    "noise_from_json",
    "noise_table",
    "stacked_factors",
    "table_noise",
    "tensor_noise",
]

NOISE_KINDS: dict[str, type[Noise]] = {cls.kind: cls for cls in (FullNoise, TableNoise, LowRankNoise)}


def noise_from_config(config: Any) -> Noise:
    """The noise spec an ESConfig asks for; ConfigError naming the bad es.* field."""
    return spec_from_config(NOISE_KINDS, config, "noise")


def noise_from_json(record: Mapping[str, Any]) -> Noise:
    """Rebuild a spec from `Noise.to_json()` output; ValueError on an unknown kind or setting."""
    return spec_from_json(NOISE_KINDS, record, "noise")
