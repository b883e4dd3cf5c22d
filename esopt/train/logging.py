"""Run-directory outputs: namespaced metrics (JSONL always; TensorBoard or W&B by `report_to`) and trajectories."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import resource
import socket
import sys
from pathlib import Path
from urllib.parse import urlparse

from esopt.confutil import ConfigError

REPORT_TO = ("auto", "tensorboard", "wandb", "none")
"""Where metrics go besides metrics.jsonl: auto = TensorBoard when it is installed, else nowhere."""
REPORT_TO_HELP = (
    "where metrics go besides metrics.jsonl: tensorboard (<run>/tensorboard), wandb (Weights & Biases; offline "
    "into <run>/wandb when the W&B server cannot be reached), none, or auto (tensorboard when installed)"
)
_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}

TRL_NAMES = {
    "train/mean_reward": "train/reward",
    "train/fitness_mean": "train/reward",  # ES: a member's fitness is its mean episode reward
    "eval/mean_reward": "eval/reward",
    "es/alpha": "train/learning_rate",  # ES's step size plays the optimizer learning rate's part
}
"""esopt metric -> the name TRL's trainers log the same quantity under. TensorBoard and W&B get TRL's
names so dashboards built for TRL runs show esopt runs too; metrics.jsonl keeps esopt's names."""


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (MB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def check_report_to(report_to: str) -> None:
    """A ConfigError (one line, naming the pip install) for an unknown sink or one whose package is missing."""
    if report_to not in REPORT_TO:
        raise ConfigError(f"report_to must be one of {', '.join(REPORT_TO)}, got {report_to!r}")
    package = _PACKAGES.get(report_to)
    if package and importlib.util.find_spec(package) is None:
        raise ConfigError(f"report_to {report_to} needs the {package} package: pip install {package}  (or report_to none)")


def _wandb_mode() -> str:
    """WANDB_MODE when set; otherwise online when the W&B server answers, offline when there is no network."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    try:
        socket.create_connection((host, 443), timeout=3).close()
        return "online"
    except OSError:
        return "offline"


def _trl_named(values: dict) -> dict[str, float]:
    return {TRL_NAMES.get(key, key): value for key, value in values.items() if isinstance(value, (int, float))}


class MetricsLogger:
    """Appends {"step": k, "<namespace>/<name>": value, ...} lines to metrics.jsonl and mirrors the numbers
    to TensorBoard or W&B (`report_to`). The one logger every trainer uses."""

    def __init__(self, run_dir: Path, report_to: str = "auto", config: dict | None = None):
        check_report_to(report_to)
        self.path = run_dir / "metrics.jsonl"
        self._tensorboard = None
        self._wandb = None
        if report_to in ("auto", "tensorboard") and (report_to == "tensorboard" or importlib.util.find_spec("tensorboard")):
            from torch.utils.tensorboard import SummaryWriter

            self._tensorboard = SummaryWriter(str(run_dir / "tensorboard"))
        elif report_to == "wandb":
            self._wandb = self._start_wandb(run_dir, config or {})

    @staticmethod
    def _start_wandb(run_dir: Path, config: dict):
        import wandb

        mode = _wandb_mode()
        settings = wandb.Settings(console="off", silent=True)
        arguments = dict(
            project=os.environ.get("WANDB_PROJECT", "esopt"),
            name=run_dir.name,
            id=hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:16],  # a resumed run continues its W&B run
            resume="allow",
            dir=str(run_dir),
            config=config,
            settings=settings,
        )
        try:
            return wandb.init(mode=mode, **arguments)
        except Exception as e:  # e.g. a server that answers but no login: keep the run, log offline
            if mode == "offline":
                raise
            print(f"esopt: W&B online logging failed ({type(e).__name__}: {e}); logging offline to {run_dir}/wandb", file=sys.stderr)
            return wandb.init(mode="offline", **arguments)

    def log(self, step: int, values: dict[str, float]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **values}) + "\n")
        if self._tensorboard is not None:
            for key, value in _trl_named(values).items():
                self._tensorboard.add_scalar(key, value, step)
            self._tensorboard.flush()
        if self._wandb is not None:
            self._wandb.log(_trl_named(values), step=step)

    def close(self) -> None:
        if self._tensorboard is not None:
            self._tensorboard.close()
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


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
