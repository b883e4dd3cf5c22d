"""Pure-torch math of Agentic ESOpt: noise kinds, fitness shaping, schedules, strategies, optimizers,
parameter scopes and the update history. Read strategies/base.py first (ask -> members, tell -> Update),
then weights.py (what a member and an update do to the weights)."""

from esopt.es.config import ESConfig
from esopt.es.history import HistoryWriter, read_history, replay
from esopt.es.noise import (
    CHUNK_NUMEL,
    DEFAULT_TABLE_SIZE,
    LOWRANK_VECTORS,
    NOISE_KINDS,
    FullNoise,
    LowRankNoise,
    Noise,
    TableNoise,
    is_matrix,
    lowrank_direction,
    lowrank_factors,
    lowrank_perturbation,
    noise_table,
    stacked_factors,
    table_noise,
    tensor_noise,
)
from esopt.es.optimizers import OPTIMIZERS, SGD, Adam, Momentum, Optimizer, OptimizerState
from esopt.es.partition import Partition, subspace_mask
from esopt.es.records import Member, Update
from esopt.es.schedule import SCHEDULE_KINDS, Schedule
from esopt.es.scope import SCOPES, Scope
from esopt.es.seeds import derive_seed, member_seeds
from esopt.es.shaping import SHAPING_METHODS, shape_fitness
from esopt.es.strategies import STRATEGIES, Strategy, make_strategy, register_strategy
from esopt.es.weights import apply_update, perturb_tensor, tensors_moved, update_direction

__all__ = [
    "CHUNK_NUMEL",
    "DEFAULT_TABLE_SIZE",
    "LOWRANK_VECTORS",
    "NOISE_KINDS",
    "OPTIMIZERS",
    "SCHEDULE_KINDS",
    "SCOPES",
    "SHAPING_METHODS",
    "STRATEGIES",
    "SGD",
    "Adam",
    "ESConfig",
    "FullNoise",
    "HistoryWriter",
    "LowRankNoise",
    "Member",
    "Momentum",
    "Noise",
    "Optimizer",
    "OptimizerState",
    "Partition",
    "Schedule",
    "Scope",
    "Strategy",
    "TableNoise",
    "Update",
    "apply_update",
    "derive_seed",
    "is_matrix",
    "lowrank_direction",
    "lowrank_factors",
    "lowrank_perturbation",
    "make_strategy",
    "member_seeds",
    "noise_table",
    "perturb_tensor",
    "read_history",
    "register_strategy",
    "replay",
    "shape_fitness",
    "stacked_factors",
    "subspace_mask",
    "table_noise",
    "tensor_noise",
    "tensors_moved",
    "update_direction",
]
