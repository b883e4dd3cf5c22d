"""Pure-torch math of Agentic ESOpt: noise, fitness shaping, schedules, strategies and update history."""

from esopt.es.history import HistoryWriter, read_history, replay
from esopt.es.lowrank import is_matrix, lowrank_direction, lowrank_factors, lowrank_perturbation, stacked_factors
from esopt.es.noise import CHUNK_NUMEL, DEFAULT_TABLE_SIZE, derive_seed, member_seeds, noise_table, subspace_mask, table_noise, tensor_noise
from esopt.es.schedule import SCHEDULE_KINDS, Schedule
from esopt.es.shaping import SHAPING_METHODS, shape_fitness
from esopt.es.strategy import (
    LOWRANK_VECTORS,
    NOISE_TYPES,
    STRATEGIES,
    ESConfig,
    Member,
    Strategy,
    Update,
    apply_update,
    perturb_tensor,
    update_direction,
)

__all__ = [
    "CHUNK_NUMEL",
    "DEFAULT_TABLE_SIZE",
    "LOWRANK_VECTORS",
    "NOISE_TYPES",
    "SCHEDULE_KINDS",
    "SHAPING_METHODS",
    "STRATEGIES",
    "ESConfig",
    "HistoryWriter",
    "Member",
    "Schedule",
    "Strategy",
    "Update",
    "apply_update",
    "derive_seed",
    "is_matrix",
    "lowrank_direction",
    "lowrank_factors",
    "lowrank_perturbation",
    "stacked_factors",
    "member_seeds",
    "noise_table",
    "perturb_tensor",
    "read_history",
    "replay",
    "shape_fitness",
    "subspace_mask",
    "table_noise",
    "tensor_noise",
    "update_direction",
]
