"""ES strategies: member sampling (ask), fitness shaping into an update (tell), and applying updates."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

import torch

from esopt.confutil import ConfigError, opt
from esopt.es.lowrank import is_matrix, lowrank_direction, lowrank_perturbation
from esopt.es.noise import DEFAULT_TABLE_SIZE, derive_seed, member_seeds, subspace_mask, table_noise, tensor_noise
from esopt.es.parallel import for_each_tensor
from esopt.es.schedule import Schedule
from esopt.es.shaping import SHAPING_METHODS, shape_fitness

__all__ = [
    "STRATEGIES",
    "NOISE_TYPES",
    "LOWRANK_VECTORS",
    "ESConfig",
    "Member",
    "Update",
    "Strategy",
    "perturb_tensor",
    "update_direction",
    "apply_update",
]

STRATEGIES = ("agentic-esopt", "vanilla-es", "copes")
NOISE_TYPES = ("full", "lowrank", "table")
LOWRANK_VECTORS = ("frozen", "full")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_real(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass
class ESConfig:
    """Evolution-strategy hyperparameters (population, noise scale, step size and their schedules)."""

    strategy: str = opt(
        "agentic-esopt",
        help="'agentic-esopt' (sigma cosine-decays from sigma to sigma_final), 'vanilla-es' (constant sigma) or "
        "'copes' (cosine sigma; each step a fresh random partition of all weights into K subspaces, G/K members "
        "per subspace, each perturbing only its subspace with sigma*sqrt(K))",
    )
    subspaces: int = opt(4, help="K, the number of disjoint parameter subspaces per step (copes only)")
    population: int = opt(8, help="G: members evaluated per step (must be even when antithetic)")
    sigma: float = opt(1e-3, help="sigma_0: perturbation scale at the first step")
    sigma_final: float = opt(2.5e-4, help="sigma_T: perturbation scale at the last step (agentic-esopt only)")
    alpha: float = opt(5e-4, help="step size alpha (1/sigma folded in): theta += alpha/G * sum_i z_i eps_i")
    alpha_final: float | None = opt(
        None, help="if set, alpha cosine-decays from alpha to alpha_final; if null, alpha is constant"
    )
    warmup_steps: int = opt(0, help="steps of linear warmup applied to both the sigma and alpha schedules")
    antithetic: bool = opt(False, help="evaluate each seed at +sigma*eps and -sigma*eps (population G/2 seeds)")
    shaping: str = opt("zscore", help="fitness shaping: 'zscore' (population z-score) or 'rank' (centered ranks)")
    noise: str = opt(
        "full",
        help="'full' (i.i.d. N(0,1) for every weight, drawn from per-member streams), 'table' (full-rank too: each "
        "tensor's noise is a slice of one shared N(0,1) table at an offset hashed from (member seed, tensor name), "
        "OpenAI-ES style; reading a slice is much cheaper than drawing fresh normals, for table_size*4 bytes of "
        "memory) or 'lowrank' (EGGROLL: each 2-D weight W (m x n) moves along A B^T / sqrt(rank), A (m x rank), "
        "B (n x rank); lets the local evaluator run the whole population in one batched forward that shares the "
        "base weights)",
    )
    table_size: int = opt(DEFAULT_TABLE_SIZE, help="noise=table: entries of the shared noise table (float32; >= the largest tensor)")
    rank: int = opt(1, help="r, the rank of each member's perturbation of a 2-D weight (noise=lowrank only)")
    lowrank_vectors: str = opt(
        "frozen",
        help="noise=lowrank: what happens to non-matrix tensors (norm weights, biases): 'frozen' (never perturbed "
        "or updated; keeps population batching possible) or 'full' (full-rank noise; members then run one after "
        "another with materialised weights)",
    )

    def validate(self) -> None:
        """Raise ConfigError (a ValueError) naming the first bad field."""
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"es.strategy: unknown strategy {self.strategy!r}; expected one of {', '.join(STRATEGIES)}")
        if not _is_int(self.population) or self.population < 1:
            raise ConfigError(f"es.population must be an integer >= 1, got {self.population!r}")
        if not isinstance(self.antithetic, bool):
            raise ConfigError(f"es.antithetic must be true or false, got {self.antithetic!r}")
        if self.antithetic and self.population % 2:
            raise ConfigError(f"es.population must be even with es.antithetic=true, got {self.population}")
        if not _is_real(self.sigma) or self.sigma <= 0:
            raise ConfigError(f"es.sigma must be a finite number > 0, got {self.sigma!r}")
        if self.strategy == "agentic-esopt" and (not _is_real(self.sigma_final) or self.sigma_final <= 0):
            raise ConfigError(f"es.sigma_final must be a finite number > 0, got {self.sigma_final!r}")
        if not _is_real(self.alpha) or self.alpha < 0:
            raise ConfigError(f"es.alpha must be a finite number >= 0, got {self.alpha!r}")
        if self.alpha_final is not None and (not _is_real(self.alpha_final) or self.alpha_final < 0):
            raise ConfigError(f"es.alpha_final must be null or a finite number >= 0, got {self.alpha_final!r}")
        if not _is_int(self.warmup_steps) or self.warmup_steps < 0:
            raise ConfigError(f"es.warmup_steps must be an integer >= 0, got {self.warmup_steps!r}")
        if self.strategy == "copes":
            if not _is_int(self.subspaces) or self.subspaces < 1:
                raise ConfigError(f"es.subspaces must be an integer >= 1, got {self.subspaces!r}")
            if self.population % self.subspaces or (self.antithetic and (self.population // self.subspaces) % 2):
                raise ConfigError(
                    f"es.population ({self.population}) must split evenly into es.subspaces ({self.subspaces})"
                    + (" with an even number of members each (antithetic)" if self.antithetic else "")
                )
        if self.shaping not in SHAPING_METHODS:
            raise ConfigError(f"es.shaping: unknown method {self.shaping!r}; expected one of {', '.join(SHAPING_METHODS)}")
        if self.noise not in NOISE_TYPES:
            raise ConfigError(f"es.noise: unknown noise {self.noise!r}; expected one of {', '.join(NOISE_TYPES)}")
        if self.noise == "table" and (not _is_int(self.table_size) or self.table_size < 1):
            raise ConfigError(f"es.table_size must be an integer >= 1, got {self.table_size!r}")
        if self.noise == "lowrank":
            if not _is_int(self.rank) or self.rank < 1:
                raise ConfigError(f"es.rank must be an integer >= 1, got {self.rank!r}")
            if self.lowrank_vectors not in LOWRANK_VECTORS:
                raise ConfigError(
                    f"es.lowrank_vectors: unknown value {self.lowrank_vectors!r}; expected one of {', '.join(LOWRANK_VECTORS)}"
                )
            if self.strategy == "copes":
                raise ConfigError(
                    "es.noise=lowrank cannot be combined with es.strategy=copes: a CoPES subspace mask would make "
                    "A B^T full-rank (use es.strategy agentic-esopt or vanilla-es with low-rank noise)"
                )


@dataclass(frozen=True)
class Member:
    """Population member `index` of a step, evaluated at theta + sign * sigma * eps(seed)."""

    index: int
    seed: int
    sigma: float
    sign: int = 1
    subspace: int | None = None
    """CoPES: the only subspace this member perturbs (None = every weight)."""
    subspaces: int = 1
    partition_seed: int = 0
    noise: str = "full"
    """'full', 'table' (slices of the shared noise table) or 'lowrank' (2-D weights move along A B^T / sqrt(rank))."""
    rank: int = 1
    lowrank_vectors: str = "frozen"
    """Low-rank noise: 'frozen' or 'full' for the non-matrix tensors."""
    table_size: int = DEFAULT_TABLE_SIZE
    """Table noise: entries of the shared table."""


@dataclass
class Update:
    """One committed ES step: theta += alpha/len(seeds) * sum_i coefficients[i] * eps(seeds[i])."""

    step: int
    seeds: list[int]
    coefficients: list[float]
    alpha: float
    sigma: float
    fitness: list[float]
    stats: dict = field(default_factory=dict)
    member_subspaces: list[int] | None = None
    """CoPES: each member's subspace (None = full-space members)."""
    subspaces: int = 1
    partition_seed: int = 0
    noise: str = "full"
    """The members' noise: 'full', 'table' (then `table_size` says which table) or 'lowrank' (then `rank`
    and `lowrank_vectors` say how)."""
    rank: int = 1
    lowrank_vectors: str = "frozen"
    table_size: int = DEFAULT_TABLE_SIZE

    def __post_init__(self) -> None:
        if len(self.seeds) != len(self.coefficients):
            raise ValueError(
                f"Update has {len(self.seeds)} seeds but {len(self.coefficients)} coefficients"
            )
        if self.member_subspaces is not None and len(self.member_subspaces) != len(self.seeds):
            raise ValueError("Update.member_subspaces must give one subspace per member")
        if self.noise not in NOISE_TYPES:
            raise ValueError(f"Update.noise must be one of {', '.join(NOISE_TYPES)}, got {self.noise!r}")
        if self.noise == "lowrank":
            if not _is_int(self.rank) or self.rank < 1:
                raise ValueError(f"Update.rank must be an integer >= 1, got {self.rank!r}")
            if self.lowrank_vectors not in LOWRANK_VECTORS:
                raise ValueError(f"Update.lowrank_vectors must be one of {', '.join(LOWRANK_VECTORS)}, got {self.lowrank_vectors!r}")
            if self.member_subspaces is not None:
                raise ValueError("Update: low-rank noise cannot be combined with CoPES subspaces")
        if self.noise == "table" and (not _is_int(self.table_size) or self.table_size < 1):
            raise ValueError(f"Update.table_size must be an integer >= 1, got {self.table_size!r}")

    def to_json(self) -> dict:
        """Return a JSON-serialisable dict; finite floats round-trip exactly through json."""
        return {
            "step": int(self.step),
            "seeds": [int(s) for s in self.seeds],
            "coefficients": [float(c) for c in self.coefficients],
            "alpha": float(self.alpha),
            "sigma": float(self.sigma),
            "fitness": [float(f) for f in self.fitness],
            "stats": dict(self.stats),
            **(
                {
                    "member_subspaces": [int(k) for k in self.member_subspaces],
                    "subspaces": int(self.subspaces),
                    "partition_seed": int(self.partition_seed),
                }
                if self.member_subspaces is not None
                else {}
            ),
            **(
                {"noise": self.noise, "rank": int(self.rank), "lowrank_vectors": self.lowrank_vectors}
                if self.noise == "lowrank"
                else {}
            ),
            **({"noise": self.noise, "table_size": int(self.table_size)} if self.noise == "table" else {}),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Update":
        """Rebuild an Update from `to_json()` output; raises ValueError on missing or bad fields."""
        if not isinstance(d, Mapping):
            raise ValueError(f"an Update must be a JSON object, got {type(d).__name__}")
        missing = [k for k in ("step", "seeds", "coefficients", "alpha", "sigma") if k not in d]
        if missing:
            raise ValueError(f"Update record is missing field(s): {', '.join(missing)}")
        try:
            return cls(
                step=int(d["step"]),
                seeds=[int(s) for s in d["seeds"]],
                coefficients=[float(c) for c in d["coefficients"]],
                alpha=float(d["alpha"]),
                sigma=float(d["sigma"]),
                fitness=[float(f) for f in d.get("fitness", [])],
                stats=dict(d.get("stats") or {}),
                member_subspaces=[int(k) for k in d["member_subspaces"]] if "member_subspaces" in d else None,
                subspaces=int(d.get("subspaces", 1)),
                partition_seed=int(d.get("partition_seed", 0)),
                noise=str(d.get("noise", "full")),
                rank=int(d.get("rank", 1)),
                lowrank_vectors=str(d.get("lowrank_vectors", "frozen")),
                table_size=int(d.get("table_size", DEFAULT_TABLE_SIZE)),
            )
        except (TypeError, ValueError) as e:
            raise ValueError(f"malformed Update record: {e}") from e


class Strategy:
    """Samples members and turns their fitness into Updates for one run."""

    def __init__(self, config: ESConfig, total_steps: int, run_seed: int):
        config.validate()
        if not _is_int(total_steps) or total_steps < 1:
            raise ConfigError(f"total_steps must be an integer >= 1, got {total_steps!r}")
        self.config = config
        self.total_steps = total_steps
        self.run_seed = int(run_seed)
        if config.strategy in ("agentic-esopt", "copes"):
            self.sigma_schedule = Schedule("cosine", config.sigma, config.sigma_final, config.warmup_steps, total_steps)
        else:
            self.sigma_schedule = Schedule("constant", config.sigma, None, config.warmup_steps, total_steps)
        if config.alpha_final is None:
            self.alpha_schedule = Schedule("constant", config.alpha, None, config.warmup_steps, total_steps)
        else:
            self.alpha_schedule = Schedule("cosine", config.alpha, config.alpha_final, config.warmup_steps, total_steps)

    def sigma(self, step: int) -> float:
        """Return the perturbation scale at `step`."""
        return self.sigma_schedule.value(step)

    def alpha(self, step: int) -> float:
        """Return the step size at `step`."""
        return self.alpha_schedule.value(step)

    def ask(self, step: int) -> list[Member]:
        """Return the G members to evaluate at `step` (antithetic: each seed as sign +1 then -1)."""
        g = self.config.population
        sigma = self.sigma(step)
        if self.config.antithetic:
            seeds = member_seeds(self.run_seed, step, g // 2)
            members = [
                Member(index=2 * j + k, seed=s, sigma=sigma, sign=1 if k == 0 else -1)
                for j, s in enumerate(seeds)
                for k in (0, 1)
            ]
        else:
            members = [Member(index=i, seed=s, sigma=sigma) for i, s in enumerate(member_seeds(self.run_seed, step, g))]
        if self.config.noise == "lowrank":
            members = [
                replace(m, noise="lowrank", rank=self.config.rank, lowrank_vectors=self.config.lowrank_vectors)
                for m in members
            ]
        elif self.config.noise == "table":
            members = [replace(m, noise="table", table_size=self.config.table_size) for m in members]
        if self.config.strategy != "copes":
            return members
        k = self.config.subspaces
        per_subspace = g // k
        partition_seed = derive_seed(self.run_seed, "copes-partition", step)
        return [
            replace(m, sigma=sigma * math.sqrt(k), subspace=m.index // per_subspace, subspaces=k, partition_seed=partition_seed)
            for m in members
        ]

    def tell(self, step: int, members: Sequence[Member], fitness: Sequence[float]) -> Update:
        """Shape the members' fitness and return the step's Update (not yet applied)."""
        members = list(members)
        raw = [float(f) for f in fitness]
        if len(members) != len(raw):
            raise ValueError(f"tell got {len(members)} members but {len(raw)} fitness values")
        if not members:
            raise ValueError("tell needs at least one member")
        z = shape_fitness(raw, self.config.shaping)
        n = len(raw)
        mean = math.fsum(raw) / n
        std = math.sqrt(math.fsum((f - mean) ** 2 for f in raw) / n)
        return Update(
            step=int(step),
            seeds=[m.seed for m in members],
            coefficients=[zi * m.sign for zi, m in zip(z, members)],
            alpha=self.alpha(step),
            sigma=self.sigma(step),
            fitness=raw,
            stats={"mean": mean, "std": std, "min": min(raw), "max": max(raw)},
            member_subspaces=[m.subspace for m in members] if members[0].subspace is not None else None,
            subspaces=members[0].subspaces,
            partition_seed=members[0].partition_seed,
            noise=members[0].noise,
            rank=members[0].rank,
            lowrank_vectors=members[0].lowrank_vectors,
            table_size=members[0].table_size,
        )


def perturb_tensor(name: str, base: torch.Tensor, member: Member, out: torch.Tensor) -> None:
    """Write base + sign * sigma * eps(member.seed, name) into `out` (base float32, any float `out` dtype)."""
    if base.dtype != torch.float32:
        raise TypeError(f"perturb_tensor: base tensor {name!r} must be float32 (the master copy), got {base.dtype}")
    if out.shape != base.shape:
        raise ValueError(f"perturb_tensor: out shape {tuple(out.shape)} != base shape {tuple(base.shape)} for {name!r}")
    if member.noise == "lowrank" and is_matrix(base.shape):
        eps = lowrank_perturbation(member.seed, name, base.shape, member.rank)
    elif member.noise == "lowrank" and member.lowrank_vectors == "frozen":
        out.copy_(base)
        return
    elif member.noise not in NOISE_TYPES:
        raise ValueError(f"perturb_tensor: unknown noise {member.noise!r} for member {member.index}")
    else:
        eps = _full_rank_noise(member.noise, member.seed, name, base.shape, member.table_size)
    if member.subspace is not None:
        # Out of place: table noise is a view of the shared table.
        eps = eps * subspace_mask(member.partition_seed, name, base.shape, member.subspace, member.subspaces)
    eps = eps.to(base.device)
    scale = float(member.sign) * float(member.sigma)
    if out.dtype == torch.float32:
        torch.add(base, eps, alpha=scale, out=out)
    else:
        # Low-precision weights: add in fp32 and round once, so the result is the nearest
        # representable value to the fp32 perturbed weight.
        out.copy_(torch.add(base, eps, alpha=scale))


def _full_rank_noise(
    noise: str, seed: int, name: str, shape: torch.Size, table_size: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """eps(seed, name) for full-rank noise kinds: fresh per-member normals, or (table) a read-only view of
    the shared table (`out` is then not written)."""
    if noise == "table":
        return table_noise(seed, name, shape, table_size)
    return tensor_noise(seed, name, shape, out=out)


def _merged_coefficients(update: Update) -> dict[tuple[int, int | None], float]:
    # Members sharing a seed (antithetic pairs) are merged first, in float64, in order of first
    # appearance: half the noise generation, and a +/- pair with equal fitness cancels exactly
    # instead of leaving an fp32 rounding residue. Keyed by (seed, CoPES subspace).
    subspaces = update.member_subspaces or [None] * len(update.seeds)
    merged: dict[tuple[int, int | None], float] = {}
    for seed, subspace, coef in zip(update.seeds, subspaces, update.coefficients):
        merged[(seed, subspace)] = merged.get((seed, subspace), 0.0) + float(coef)
    return merged


def update_direction(
    update: Update,
    name: str,
    shape: Sequence[int] | torch.Size,
    *,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Return float32 sum_i coefficients[i] * eps(seeds[i], name), accumulated in fp32 in member order.

    Low-rank updates: eps_i = A_i B_i^T / sqrt(rank) for 2-D tensors (one matmul over all members),
    full-rank noise or zero (frozen) for the other tensors, as the update's `lowrank_vectors` says.
    """
    shape = torch.Size(int(d) for d in shape)
    if update.noise == "lowrank":
        if is_matrix(shape):
            merged = [(seed, coef) for (seed, _), coef in _merged_coefficients(update).items()]
            return lowrank_direction(merged, name, shape, update.rank, device=device)
        if update.lowrank_vectors == "frozen":
            return torch.zeros(shape, dtype=torch.float32, device=device)
    direction = torch.zeros(shape, dtype=torch.float32, device=device)
    # Fresh noise is generated on CPU into one buffer reused per member; table noise needs none.
    buf = torch.empty(shape, dtype=torch.float32) if update.noise != "table" else None
    for (seed, subspace), coef in _merged_coefficients(update).items():
        if coef == 0.0:
            continue
        eps = _full_rank_noise(update.noise, seed, name, shape, update.table_size, out=buf)
        if subspace is not None:
            eps = eps * subspace_mask(update.partition_seed, name, shape, subspace, update.subspaces)
        direction.add_(eps.to(direction.device), alpha=float(coef))
    return direction


def apply_update(tensors: Mapping[str, torch.Tensor], update: Update) -> None:
    """Apply `update` in place to every (float32) tensor: t += alpha/G * update_direction(...)."""
    for name, t in tensors.items():
        if t.dtype != torch.float32:
            raise TypeError(
                f"apply_update: tensor {name!r} is {t.dtype}; updates go to the float32 master copy "
                "(low-precision weights cannot hold a small update)"
            )
    if update.alpha == 0.0 or not any(c != 0.0 for c in _merged_coefficients(update).values()):
        # Adding a zero direction could still flip -0.0 to +0.0; a zero update must be a no-op.
        return
    scale = update.alpha / len(update.seeds)

    def update_one(item: tuple[str, torch.Tensor]) -> None:
        name, t = item
        if update.noise == "lowrank" and update.lowrank_vectors == "frozen" and not is_matrix(t.shape):
            return  # frozen: not even a zero add (which could turn -0.0 into +0.0)
        with torch.no_grad():
            t.add_(update_direction(update, name, t.shape, device=t.device), alpha=scale)

    for_each_tensor(update_one, tensors.items())
