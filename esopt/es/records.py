"""The two records ES passes around: a Member to evaluate, and the Update a step commits.

Both carry one noise spec, the parameter scope, and (CoPES) the partition; an Update also carries the
optimizer, so `history.jsonl` holds everything a bit-exact replay needs. Records written before the
noise spec existed (flat `noise`, `rank`, `lowrank_vectors`, `table_size` fields) still load.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from esopt.es.noise import FullNoise, Noise, noise_from_json
from esopt.es.optimizers import SGD, Optimizer, optimizer_from_json
from esopt.es.partition import Partition
from esopt.es.scope import Scope

__all__ = ["Member", "Update"]


@dataclass(frozen=True)
class Member:
    """Population member `index` of a step, evaluated at theta + sign * sigma * eps(seed) on the scope's
    tensors (CoPES: only on the elements of `subspace` of `partition`)."""

    index: int
    seed: int
    sigma: float
    sign: int = 1
    noise: Noise = FullNoise()
    scope: Scope = Scope()
    partition: Partition | None = None
    subspace: int | None = None

    def to_json(self) -> dict:
        """Plain data (for process boundaries that do not pickle)."""
        record: dict[str, Any] = {"index": self.index, "seed": self.seed, "sigma": self.sigma, "sign": self.sign}
        record["noise"] = self.noise.to_json()
        record["scope"] = self.scope.spec
        if self.partition is not None:
            record.update(partition_seed=self.partition.seed, subspaces=self.partition.parts, subspace=self.subspace)
        return record

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Member":
        partition = Partition(int(d["partition_seed"]), int(d["subspaces"])) if "partition_seed" in d else None
        return cls(
            index=int(d["index"]),
            seed=int(d["seed"]),
            sigma=float(d["sigma"]),
            sign=int(d.get("sign", 1)),
            noise=noise_from_json(d["noise"]) if "noise" in d else FullNoise(),
            scope=Scope(str(d.get("scope", "all"))),
            partition=partition,
            subspace=int(d["subspace"]) if partition is not None else None,
        )


def _legacy_noise(d: Mapping[str, Any]) -> Noise:
    """The noise of a record that names it by flat fields ('noise': 'lowrank', 'rank': 2, ...)."""
    kind = str(d["noise"])
    settings = {
        "table": {"size": int(d["table_size"])} if "table_size" in d else {},
        "lowrank": {"rank": int(d.get("rank", 1)), "vectors": str(d.get("lowrank_vectors", "frozen"))},
    }.get(kind, {})
    return noise_from_json({"kind": kind, **settings})


@dataclass
class Update:
    """One committed ES step: theta += alpha/G * sum_i coefficients[i] * eps(seeds[i]) over the scope's
    tensors, moved through `optimizer` (plain SGD by default)."""

    step: int
    seeds: list[int]
    coefficients: list[float]
    alpha: float
    sigma: float
    fitness: list[float]
    stats: dict = field(default_factory=dict)
    noise: Noise = FullNoise()
    scope: Scope = Scope()
    optimizer: Optimizer = SGD()
    partition: Partition | None = None
    """CoPES: the step's partition into subspaces (None = every member perturbs all of its tensors)."""
    member_subspaces: list[int] | None = None
    """CoPES: each member's subspace of `partition`."""

    def __post_init__(self) -> None:
        if len(self.seeds) != len(self.coefficients):
            raise ValueError(f"Update has {len(self.seeds)} seeds but {len(self.coefficients)} coefficients")
        if (self.partition is None) != (self.member_subspaces is None):
            raise ValueError("Update: a partition and member_subspaces go together")
        if self.member_subspaces is not None:
            if len(self.member_subspaces) != len(self.seeds):
                raise ValueError("Update.member_subspaces must give one subspace per member")
            if not self.noise.partitionable:
                raise ValueError(f"Update: {self.noise.kind} noise cannot be combined with CoPES subspaces")

    def to_json(self) -> dict:
        """A JSON-serialisable dict; finite floats round-trip exactly through json. Settings at their
        defaults (full noise, scope all, plain SGD) are left out."""
        record: dict[str, Any] = {
            "step": int(self.step),
            "seeds": [int(s) for s in self.seeds],
            "coefficients": [float(c) for c in self.coefficients],
            "alpha": float(self.alpha),
            "sigma": float(self.sigma),
            "fitness": [float(f) for f in self.fitness],
            "stats": dict(self.stats),
        }
        if self.partition is not None:
            record["member_subspaces"] = [int(k) for k in self.member_subspaces or []]
            record["subspaces"] = int(self.partition.parts)
            record["partition_seed"] = int(self.partition.seed)
        if self.noise != FullNoise():
            record["noise"] = self.noise.to_json()
        if not self.scope.everything:
            record["scope"] = self.scope.spec
        if self.optimizer != SGD():
            record["optimizer"] = self.optimizer.to_json()
        return record

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Update":
        """Rebuild an Update from `to_json()` output (or an older record); ValueError on missing or bad fields."""
        if not isinstance(d, Mapping):
            raise ValueError(f"an Update must be a JSON object, got {type(d).__name__}")
        missing = [k for k in ("step", "seeds", "coefficients", "alpha", "sigma") if k not in d]
        if missing:
            raise ValueError(f"Update record is missing field(s): {', '.join(missing)}")
        try:
            noise = d.get("noise", {"kind": "full"})
            partitioned = "member_subspaces" in d
            return cls(
                step=int(d["step"]),
                seeds=[int(s) for s in d["seeds"]],
                coefficients=[float(c) for c in d["coefficients"]],
                alpha=float(d["alpha"]),
                sigma=float(d["sigma"]),
                fitness=[float(f) for f in d.get("fitness", [])],
                stats=dict(d.get("stats") or {}),
                noise=_legacy_noise(d) if isinstance(noise, str) else noise_from_json(noise),
                scope=Scope(str(d.get("scope", "all"))),
                optimizer=optimizer_from_json(d["optimizer"]) if "optimizer" in d else SGD(),
                partition=Partition(int(d.get("partition_seed", 0)), int(d.get("subspaces", 1))) if partitioned else None,
                member_subspaces=[int(k) for k in d["member_subspaces"]] if partitioned else None,
            )
        except (TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"malformed Update record: {e}") from e
