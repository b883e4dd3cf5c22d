"""Optimizers on the ES gradient estimate, and weight decay toward the base weights (`es.optimizer`,
`es.weight_decay`).

Per tensor, an update gives the estimate g = (1/G) sum_i z_i eps_i, and alpha (1/sigma folded in):
- sgd:      theta += alpha * g                      (exactly the plain ES step; needs no state)
- momentum: v = beta * v + g;  theta += alpha * v    (heavy ball: the step approaches alpha/(1-beta) * g)
- adam:     m, v = Adam's bias-corrected moments of g;  theta += alpha * m / (sqrt(v) + eps)
            Per-element normalisation of a noisy ES estimate behaves like sign-SGD: every weight in
            scope moves by about alpha per step, so alpha is a per-weight step size here (pick it
            well below sigma), not the sgd step.
Weight decay (any optimizer): theta -= alpha * weight_decay * (theta - theta_base), computed from
the weights before the step.

The optimizer's settings travel in every Update (so a replay knows them); its state (moments, the
base weights, the step count) is fp32 in an OptimizerState that a policy saves with each checkpoint.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

import torch

from esopt.confutil import ConfigError
from esopt.es.specs import spec_from_config, spec_from_json

__all__ = ["OPTIMIZERS", "SGD", "Adam", "Momentum", "Optimizer", "OptimizerState", "optimizer_from_config", "optimizer_from_json"]


def _check_fraction(value: Any, field: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ConfigError(f"{field} must be a number in [0, 1), got {value!r}")


class OptimizerState:
    """fp32 tensors by '<slot>/<tensor name>' (e.g. 'exp_avg/model.norm.weight', 'base/...') and the
    number of steps taken; state_dict() is what a checkpoint stores."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self.steps = 0

    def __bool__(self) -> bool:
        return bool(self.tensors) or self.steps > 0

    def slot(self, slot: str, name: str) -> torch.Tensor:
        return self.tensors[f"{slot}/{name}"]

    def ensure(self, slot: str, name: str, like: torch.Tensor, copy: bool = False) -> None:
        """Create slot/name as zeros shaped like `like` (or, with `copy`, as an fp32 copy of it) if missing;
        move it to `like`'s device if it lives elsewhere (a state read from a checkpoint is on the CPU)."""
        key = f"{slot}/{name}"
        if key not in self.tensors:
            self.tensors[key] = like.detach().to(torch.float32, copy=True) if copy else torch.zeros_like(like, dtype=torch.float32)
        elif self.tensors[key].device != like.device:
            self.tensors[key] = self.tensors[key].to(like.device)

    def has(self, slot: str, name: str) -> bool:
        return f"{slot}/{name}" in self.tensors

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {**self.tensors, "steps": torch.tensor(self.steps, dtype=torch.int64)}

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        state = dict(state)
        steps = state.pop("steps", None)
        self.steps = int(steps.item()) if steps is not None else 0
        self.tensors = {key: t.detach().to(torch.float32, copy=True) for key, t in state.items()}


@dataclass(frozen=True)
class Optimizer(abc.ABC):
    """How an ES update's direction moves the weights. Subclasses are frozen dataclasses of their settings."""

    weight_decay: float = 0.0

    kind: ClassVar[str]
    slots: ClassVar[tuple[str, ...]] = ()
    """Per-tensor state buffers the optimizer keeps."""

    def __post_init__(self) -> None:
        wd = self.weight_decay
        if isinstance(wd, bool) or not isinstance(wd, (int, float)) or not math.isfinite(wd) or wd < 0:
            raise ConfigError(f"es.weight_decay must be a finite number >= 0, got {wd!r}")

    @classmethod
    @abc.abstractmethod
    def from_config(cls, config: Any) -> "Optimizer":
        """The settings an ESConfig asks for (ConfigError naming the bad es.* field)."""

    @property
    def stateless(self) -> bool:
        """Plain ES: theta += alpha * g, with no state to keep or checkpoint."""
        return not self.slots and self.weight_decay == 0.0

    def prepare(self, state: OptimizerState, name: str, theta: torch.Tensor, step: int) -> None:
        """Create tensor `name`'s state before the (threaded) per-tensor steps run."""
        for slot in self.slots:
            state.ensure(slot, name, theta)
        if self.weight_decay:
            if step != 0 and not state.has("base", name):
                raise ValueError(
                    f"weight decay needs the base weights, but update {step} finds none for {name!r}: resume from a "
                    "checkpoint with its optimizer.safetensors, or replay from the base model"
                )
            state.ensure("base", name, theta, copy=True)  # the first update starts at the base weights

    def step(self, state: OptimizerState, name: str, theta: torch.Tensor, direction: torch.Tensor, members: int, alpha: float) -> None:
        """Move `theta` in place by the step for g = direction / members, and decay it toward the base."""
        pull = theta - state.slot("base", name) if self.weight_decay else None
        self.move(state, name, theta, direction, members, alpha)
        if pull is not None:
            theta.sub_(pull, alpha=alpha * self.weight_decay)

    @abc.abstractmethod
    def move(self, state: OptimizerState, name: str, theta: torch.Tensor, direction: torch.Tensor, members: int, alpha: float) -> None:
        """theta += the optimizer's step for g = direction / members (state.steps already counts this update)."""

    def to_json(self) -> dict:
        return {"kind": self.kind, **dataclasses.asdict(self)}


@dataclass(frozen=True)
class SGD(Optimizer):
    kind = "sgd"

    @classmethod
    def from_config(cls, config: Any) -> "SGD":
        return cls(weight_decay=config.weight_decay)

    def move(self, state, name, theta, direction, members, alpha) -> None:
        theta.add_(direction, alpha=alpha / members)  # the plain ES step, rounded exactly as without decay


@dataclass(frozen=True)
class Momentum(Optimizer):
    beta: float = 0.9

    kind = "momentum"
    slots = ("velocity",)

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_fraction(self.beta, "es.momentum")

    @classmethod
    def from_config(cls, config: Any) -> "Momentum":
        return cls(weight_decay=config.weight_decay, beta=config.momentum)

    def move(self, state, name, theta, direction, members, alpha) -> None:
        velocity = state.slot("velocity", name)
        velocity.mul_(self.beta).add_(direction, alpha=1.0 / members)
        theta.add_(velocity, alpha=alpha)


@dataclass(frozen=True)
class Adam(Optimizer):
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8

    kind = "adam"
    slots = ("exp_avg", "exp_avg_sq")

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_fraction(self.beta1, "es.adam_beta1")
        _check_fraction(self.beta2, "es.adam_beta2")
        if isinstance(self.eps, bool) or not isinstance(self.eps, (int, float)) or not math.isfinite(self.eps) or self.eps <= 0:
            raise ConfigError(f"es.adam_eps must be a finite number > 0, got {self.eps!r}")

    @classmethod
    def from_config(cls, config: Any) -> "Adam":
        return cls(weight_decay=config.weight_decay, beta1=config.adam_beta1, beta2=config.adam_beta2, eps=config.adam_eps)

    def move(self, state, name, theta, direction, members, alpha) -> None:
        g = direction / members
        exp_avg, exp_avg_sq = state.slot("exp_avg", name), state.slot("exp_avg_sq", name)
        exp_avg.mul_(self.beta1).add_(g, alpha=1.0 - self.beta1)
        exp_avg_sq.mul_(self.beta2).addcmul_(g, g, value=1.0 - self.beta2)
        bias1 = 1.0 - self.beta1**state.steps
        bias2 = 1.0 - self.beta2**state.steps
        denominator = (exp_avg_sq / bias2).sqrt_().add_(self.eps)
        theta.addcdiv_(exp_avg, denominator, value=alpha / bias1)


OPTIMIZERS: dict[str, type[Optimizer]] = {cls.kind: cls for cls in (SGD, Momentum, Adam)}


def optimizer_from_config(config: Any) -> Optimizer:
    """The optimizer an ESConfig asks for; ConfigError naming the bad es.* field."""
    return spec_from_config(OPTIMIZERS, config, "optimizer")


def optimizer_from_json(record: Mapping[str, Any]) -> Optimizer:
    """Rebuild an optimizer from `Optimizer.to_json()` output; ValueError on an unknown kind or setting."""
    return spec_from_json(OPTIMIZERS, record, "optimizer")
