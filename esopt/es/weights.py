"""What members and updates do to the weights: perturb one tensor for a member, and apply an update
(the same code runs live, in Ray workers, in vLLM workers and in replay, so all agree bit for bit)."""

from __future__ import annotations

from typing import Mapping

import torch

from esopt.es.noise.base import Shape, as_shape
from esopt.es.optimizers import OptimizerState
from esopt.es.parallel import for_each_tensor
from esopt.es.records import Member, Update

__all__ = ["apply_update", "perturb_tensor", "tensors_moved", "update_direction"]


def tensors_moved(record: Member | Update, tensors: Mapping[str, torch.Tensor]) -> list[str]:
    """The names of the tensors a member perturbs (or an update changes): those in its scope that its
    noise perturbs. Every other tensor stays bit-identical."""
    return [name for name in record.scope.select(tensors) if record.noise.perturbs(tensors[name].shape)]


def perturb_tensor(name: str, base: torch.Tensor, member: Member, out: torch.Tensor) -> None:
    """Write base + sign * sigma * eps(member.seed, name) into `out` (base float32, any float `out` dtype);
    a tensor the member's noise does not perturb is copied unchanged. The scope is the caller's to
    apply (see tensors_moved)."""
    if base.dtype != torch.float32:
        raise TypeError(f"perturb_tensor: base tensor {name!r} must be float32 (the master copy), got {base.dtype}")
    if out.shape != base.shape:
        raise ValueError(f"perturb_tensor: out shape {tuple(out.shape)} != base shape {tuple(base.shape)} for {name!r}")
    if not member.noise.perturbs(base.shape):
        out.copy_(base)
        return
    eps = member.noise.sample(member.seed, name, base.shape)
    if member.partition is not None:
        # Out of place: eps may be a view of the shared noise table.
        eps = eps * member.partition.mask(name, base.shape, member.subspace)
    eps = eps.to(base.device)
    scale = float(member.sign) * float(member.sigma)
    if out.dtype == torch.float32:
        torch.add(base, eps, alpha=scale, out=out)
    else:
        # Low-precision weights: add in fp32 and round once, so the result is the nearest
        # representable value to the fp32 perturbed weight.
        out.copy_(torch.add(base, eps, alpha=scale))


def _merged_terms(update: Update) -> list[tuple[int, int | None, float]]:
    # Members sharing a seed (antithetic pairs) are merged first, in float64, in order of first
    # appearance: half the noise generation, and a +/- pair with equal fitness cancels exactly
    # instead of leaving an fp32 rounding residue. Keyed by (seed, CoPES subspace).
    subspaces = update.member_subspaces or [None] * len(update.seeds)
    merged: dict[tuple[int, int | None], float] = {}
    for seed, subspace, coefficient in zip(update.seeds, subspaces, update.coefficients):
        merged[(seed, subspace)] = merged.get((seed, subspace), 0.0) + float(coefficient)
    return [(seed, subspace, coefficient) for (seed, subspace), coefficient in merged.items()]


def update_direction(
    update: Update, name: str, shape: Shape, *, device: torch.device | str | None = None
) -> torch.Tensor:
    """float32 sum_i coefficients[i] * eps(seeds[i], name), accumulated in fp32 in member order
    (zero for a tensor the update's noise does not move)."""
    shape = as_shape(shape)
    terms = _merged_terms(update)
    mask = None
    if update.partition is not None:
        partition = update.partition

        def mask(k: int) -> torch.Tensor:
            return partition.mask(name, shape, terms[k][1])

    return update.noise.direction([(seed, c) for seed, _, c in terms], name, shape, device=device, mask=mask)


def apply_update(tensors: Mapping[str, torch.Tensor], update: Update, state: OptimizerState | None = None) -> None:
    """Apply `update` in place to the float32 tensors it moves (see tensors_moved). Plain SGD:
    t += alpha/G * update_direction(...). Other optimizers and weight decay keep their fp32 state in
    `state`, which must then be given (and carried from one update to the next)."""
    for name, t in tensors.items():
        if t.dtype != torch.float32:
            raise TypeError(
                f"apply_update: tensor {name!r} is {t.dtype}; updates go to the float32 master copy "
                "(low-precision weights cannot hold a small update)"
            )
    names = tensors_moved(update, tensors)
    members = len(update.seeds)
    optimizer = update.optimizer
    if optimizer.stateless:
        if update.alpha == 0.0 or not any(c != 0.0 for _, _, c in _merged_terms(update)):
            # Adding a zero direction could still flip -0.0 to +0.0; a zero update must be a no-op.
            return
        scale = update.alpha / members

        def sgd_one(name: str) -> None:
            t = tensors[name]
            with torch.no_grad():
                t.add_(update_direction(update, name, t.shape, device=t.device), alpha=scale)

        for_each_tensor(sgd_one, names)
        return
    if state is None:
        raise ValueError(f"apply_update: optimizer {optimizer.kind!r} with weight decay {optimizer.weight_decay} needs an OptimizerState")
    for name in names:  # state is created here, not in the threads below
        optimizer.prepare(state, name, tensors[name], update.step)
    state.steps += 1

    def step_one(name: str) -> None:
        t = tensors[name]
        with torch.no_grad():
            optimizer.step(state, name, t, update_direction(update, name, t.shape, device=t.device), members, update.alpha)

    for_each_tensor(step_one, names)
