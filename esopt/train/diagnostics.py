"""Diagnostics of an ES run that a researcher reads next to the reward curve: how many steps had no signal
(every member tied, so the update was zero), and how far training moved the weights compared with sigma
(the Agentic ESOpt paper's Table 6)."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import torch

from esopt.es import Update

MAGNITUDE_QUANTILES = (0.5, 0.9, 0.99)


def step_tied(update: Update) -> bool:
    """Whether every member of the step had the same fitness (std 0: the shaped update is zero)."""
    if update.fitness:
        return min(update.fitness) == max(update.fitness)
    return update.stats.get("std", 1.0) == 0.0  # records without fitness values still carry their std


def tie_summary(history: Sequence[Update]) -> dict:
    """Steps, tied steps, their fraction, and how many of the last steps tied in a row (a run whose signal
    died out ends with a long tied tail)."""
    tied = [step_tied(u) for u in history]
    tail = 0
    for flag in reversed(tied):
        if not flag:
            break
        tail += 1
    return {"steps": len(tied), "tied": sum(tied), "fraction": sum(tied) / len(tied) if tied else 0.0, "tied_tail": tail}


def trained_names(strategy, tensors: Mapping[str, torch.Tensor]) -> list[str]:
    """The tensors a strategy's members perturb and its updates move (its scope, minus what its noise skips)."""
    return [name for name in strategy.scope.select(tensors) if strategy.noise.perturbs(tensors[name].shape)]


class BaseSnapshot:
    """An fp32 copy of the trained tensors at the start of a run, in one flat buffer, so that the end of the
    run can measure |theta_T - theta_0| without loading the base model again (one extra copy of the trained
    weights: ~0.5 GB for 135M parameters)."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], names: Sequence[str]):
        self.names = list(names)
        self.numel = sum(tensors[name].numel() for name in self.names)
        self.flat = torch.empty(self.numel, dtype=torch.float32)
        offset = 0
        for name in self.names:
            n = tensors[name].numel()
            self.flat[offset : offset + n].copy_(tensors[name].detach().reshape(-1))
            offset += n
        self.spent = False

    def take_update_magnitudes(self, final: Mapping[str, torch.Tensor], sigma_0: float, sigma_final: float) -> dict:
        """Quantiles of |final - base| over every trained weight and the shares above sigma_0 and sigma_T.
        Overwrites the snapshot with the differences (no second buffer), so it can be taken once."""
        if self.spent:
            raise RuntimeError("BaseSnapshot.take_update_magnitudes was already called (the snapshot is overwritten)")
        self.spent = True
        offset = 0
        for name in self.names:
            n = final[name].numel()
            part = self.flat[offset : offset + n]
            part.sub_(final[name].detach().reshape(-1).to(device=part.device, dtype=torch.float32)).abs_()
            offset += n
        return magnitude_stats(self.flat.numpy(), sigma_0, sigma_final, overwrite=True)


def magnitude_stats(magnitudes: np.ndarray, sigma_0: float, sigma_final: float, overwrite: bool = False) -> dict:
    """The update-magnitude numbers of the report from a flat array of |theta_T - theta_0| (quantiles
    interpolate linearly, as numpy's default; `overwrite` lets numpy reorder the array instead of copying it)."""
    if magnitudes.size == 0:
        return {"weights": 0}
    above_0 = int(np.count_nonzero(magnitudes > sigma_0))
    above_final = int(np.count_nonzero(magnitudes > sigma_final))
    moved = int(np.count_nonzero(magnitudes))
    stats = {
        "weights": int(magnitudes.size),
        "moved": moved / magnitudes.size,
        "max": float(magnitudes.max()),
        "mean": float(magnitudes.mean(dtype=np.float64)),
        "sigma_0": float(sigma_0),
        "sigma_final": float(sigma_final),
        "above_sigma_0": above_0 / magnitudes.size,
        "above_sigma_final": above_final / magnitudes.size,
    }
    values = np.quantile(magnitudes, MAGNITUDE_QUANTILES, overwrite_input=overwrite)
    stats.update({f"p{round(q * 100)}": float(v) for q, v in zip(MAGNITUDE_QUANTILES, values)})
    return stats


def diagnostics_line(ties: dict | None, magnitudes: dict | None) -> str:
    """One line for the end-of-run summary: tied steps, then |theta_T - theta_0| against sigma ('' when
    neither is known)."""
    parts = []
    if ties and ties["steps"]:
        tail = f", the last {ties['tied_tail']} in a row" if ties["tied_tail"] > 1 else ""
        parts.append(f"{ties['tied']}/{ties['steps']} steps tied ({ties['fraction']:.0%}{tail})")
    if magnitudes and magnitudes.get("weights"):
        m = magnitudes
        parts.append(
            f"|theta_T - theta_0| median {m['p50']:.2e}, p99 {m['p99']:.2e}, max {m['max']:.2e}; "
            f"{m['above_sigma_0']:.1%} > sigma_0 ({m['sigma_0']:g}), {m['above_sigma_final']:.1%} > sigma_T ({m['sigma_final']:g})"
        )
    return "ES diagnostics: " + "; ".join(parts) if parts else ""
