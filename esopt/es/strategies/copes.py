"""CoPES: each step a fresh random partition of all weights into K subspaces; G/K members per subspace,
each perturbing only its subspace with sigma*sqrt(K) (so a member's perturbation keeps its norm); one
joint fitness shaping over all G and one combined update."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from esopt.confutil import ConfigError
from esopt.es.noise import noise_from_config
from esopt.es.noise.base import is_int
from esopt.es.partition import Partition
from esopt.es.records import Member
from esopt.es.seeds import derive_seed
from esopt.es.strategies.base import Strategy, register_strategy

if TYPE_CHECKING:
    from esopt.es.config import ESConfig


@register_strategy
class CoPES(Strategy):
    name = "copes"
    sigma_decays = True

    @classmethod
    def validate_config(cls, config: "ESConfig") -> None:
        k = config.subspaces
        if not is_int(k) or k < 1:
            raise ConfigError(f"es.subspaces must be an integer >= 1, got {k!r}")
        if config.population % k or (config.antithetic and (config.population // k) % 2):
            raise ConfigError(
                f"es.population ({config.population}) must split evenly into es.subspaces ({k})"
                + (" with an even number of members each (antithetic)" if config.antithetic else "")
            )
        if not noise_from_config(config).partitionable:
            raise ConfigError(
                f"es.noise={config.noise} cannot be combined with es.strategy=copes: a CoPES subspace mask would "
                "make A B^T full-rank (use es.strategy agentic-esopt or vanilla-es with low-rank noise)"
            )

    def reshape_members(self, step: int, members: list[Member]) -> list[Member]:
        k = self.config.subspaces
        per_subspace = len(members) // k
        partition = Partition(derive_seed(self.run_seed, "copes-partition", step), k)
        return [
            replace(m, sigma=m.sigma * math.sqrt(k), partition=partition, subspace=m.index // per_subspace)
            for m in members
        ]
