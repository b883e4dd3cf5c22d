"""Step schedules for sigma and alpha: constant or cosine decay, with optional linear warmup."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["SCHEDULE_KINDS", "Schedule"]

SCHEDULE_KINDS = ("constant", "cosine")


@dataclass
class Schedule:
    """A per-step value: linear warmup, then constant or cosine decay from `start` to `end`."""

    kind: str
    start: float
    end: float | None = None
    warmup_steps: int = 0
    total_steps: int = 1

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ValueError if the schedule is malformed."""
        if self.kind not in SCHEDULE_KINDS:
            raise ValueError(f"unknown schedule kind {self.kind!r}; expected one of {', '.join(SCHEDULE_KINDS)}")
        if not math.isfinite(self.start) or self.start < 0:
            raise ValueError(f"schedule start must be finite and >= 0, got {self.start}")
        if self.kind == "cosine" and self.end is None:
            raise ValueError("cosine schedule needs an end value")
        if self.end is not None and (not math.isfinite(self.end) or self.end < 0):
            raise ValueError(f"schedule end must be finite and >= 0, got {self.end}")
        if self.warmup_steps < 0:
            raise ValueError(f"schedule warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.total_steps < 1:
            raise ValueError(f"schedule total_steps must be >= 1, got {self.total_steps}")

    def value(self, step: int) -> float:
        """Return the scheduled value at 0-based `step`."""
        if step < 0:
            raise ValueError(f"schedule step must be >= 0, got {step}")
        if step < self.warmup_steps:
            return self.start * (step + 1) / self.warmup_steps
        if self.kind == "constant":
            return float(self.start)
        assert self.end is not None
        period = max(1, self.total_steps - self.warmup_steps - 1)
        # Past the planned horizon (e.g. a resumed run given extra steps) hold the end value
        # instead of letting the cosine climb back up.
        t = min(step - self.warmup_steps, period)
        if t == 0:
            return float(self.start)  # exact, where end + (start - end) might round
        return self.end + 0.5 * (self.start - self.end) * (1.0 + math.cos(math.pi * t / period))
