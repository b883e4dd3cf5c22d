"""The strategy base class: it owns ask (sample the step's members) and tell (shape their fitness into an
Update); a strategy says how sigma is scheduled and may reshape the members it asks for."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, ClassVar, Mapping, Sequence

import torch

from esopt.confutil import ConfigError
from esopt.es.noise import noise_from_config
from esopt.es.optimizers import optimizer_from_config
from esopt.es.records import Member, Update
from esopt.es.schedule import Schedule
from esopt.es.scope import Scope
from esopt.es.seeds import member_seeds
from esopt.es.shaping import shape_fitness

if TYPE_CHECKING:
    from esopt.es.config import ESConfig

__all__ = ["STRATEGIES", "Strategy", "make_strategy", "register_strategy"]

STRATEGIES: dict[str, type["Strategy"]] = {}
"""Strategy classes by their `es.strategy` name."""


def register_strategy(cls: type["Strategy"]) -> type["Strategy"]:
    """Class decorator: make `cls` available as `es.strategy: <cls.name>`."""
    STRATEGIES[cls.name] = cls
    return cls


def make_strategy(config: "ESConfig", total_steps: int, run_seed: int) -> "Strategy":
    """The strategy `config.strategy` names, for a run of `total_steps` steps seeded by `run_seed`."""
    config.validate()
    return STRATEGIES[config.strategy](config, total_steps, run_seed)


class Strategy:
    """Samples members and turns their fitness into Updates for one run (build it with make_strategy)."""

    name: ClassVar[str]
    """The `es.strategy` value."""
    sigma_decays: ClassVar[bool] = True
    """True: sigma cosine-decays from es.sigma to es.sigma_final; False: sigma is constant."""

    @classmethod
    def validate_config(cls, config: "ESConfig") -> None:
        """Checks of the config fields only this strategy reads (ConfigError naming the field)."""

    def __init__(self, config: "ESConfig", total_steps: int, run_seed: int):
        if STRATEGIES.get(config.strategy) is not type(self):
            raise TypeError(
                f"{type(self).__name__} cannot run es.strategy={config.strategy!r}; "
                "build the configured strategy with make_strategy(config, total_steps, run_seed)"
            )
        if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
            raise ConfigError(f"total_steps must be an integer >= 1, got {total_steps!r}")
        self.config = config
        self.total_steps = total_steps
        self.run_seed = int(run_seed)
        self.noise = noise_from_config(config)
        self.scope = Scope(config.scope)
        self.optimizer = optimizer_from_config(config)
        warmup = config.warmup_steps
        if self.sigma_decays:
            self.sigma_schedule = Schedule("cosine", config.sigma, config.sigma_final, warmup, total_steps)
        else:
            self.sigma_schedule = Schedule("constant", config.sigma, None, warmup, total_steps)
        if config.alpha_final is None:
            self.alpha_schedule = Schedule("constant", config.alpha, None, warmup, total_steps)
        else:
            self.alpha_schedule = Schedule("cosine", config.alpha, config.alpha_final, warmup, total_steps)

    def sigma(self, step: int) -> float:
        """Return the perturbation scale at `step`."""
        return self.sigma_schedule.value(step)

    def alpha(self, step: int) -> float:
        """Return the step size at `step`."""
        return self.alpha_schedule.value(step)

    def prepare(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Check the scope and noise against the model's weights (ConfigError) and build shared noise state."""
        self.scope.check(tensors)
        self.noise.prepare(tensors)

    def ask(self, step: int) -> list[Member]:
        """Return the G members to evaluate at `step` (antithetic: each seed as sign +1 then -1)."""
        g = self.config.population
        common = dict(sigma=self.sigma(step), noise=self.noise, scope=self.scope)
        if self.config.antithetic:
            seeds = member_seeds(self.run_seed, step, g // 2)
            members = [
                Member(index=2 * j + k, seed=s, sign=1 if k == 0 else -1, **common)
                for j, s in enumerate(seeds)
                for k in (0, 1)
            ]
        else:
            members = [Member(index=i, seed=s, **common) for i, s in enumerate(member_seeds(self.run_seed, step, g))]
        return self.reshape_members(step, members)

    def reshape_members(self, step: int, members: list[Member]) -> list[Member]:
        """A strategy's change to the plain members of `step` (e.g. CoPES assigns subspaces). Default: none."""
        return members

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
        first = members[0]
        return Update(
            step=int(step),
            seeds=[m.seed for m in members],
            coefficients=[zi * m.sign for zi, m in zip(z, members)],
            alpha=self.alpha(step),
            sigma=self.sigma(step),
            fitness=raw,
            stats={"mean": mean, "std": std, "min": min(raw), "max": max(raw)},
            noise=first.noise,
            scope=first.scope,
            optimizer=self.optimizer,
            partition=first.partition,
            member_subspaces=[m.subspace for m in members] if first.partition is not None else None,
        )

