"""Run-directory outputs: namespaced metrics (JSONL, TensorBoard when installed) and trajectories."""

from __future__ import annotations

import json
import resource
from pathlib import Path


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (MB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class MetricsLogger:
    """Appends {"step": k, "<namespace>/<name>": value, ...} lines to metrics.jsonl."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / "metrics.jsonl"
        self._tensorboard = None
        try:
            from torch.utils.tensorboard import SummaryWriter

            self._tensorboard = SummaryWriter(str(run_dir / "tensorboard"))
        except Exception:  # TensorBoard is optional
            self._tensorboard = None

    def log(self, step: int, values: dict[str, float]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **values}) + "\n")
        if self._tensorboard is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)):
                    self._tensorboard.add_scalar(key, value, step)
            self._tensorboard.flush()

    def close(self) -> None:
        if self._tensorboard is not None:
            self._tensorboard.close()


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a crash
    return records


def write_trajectories(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")
