"""The per-run update history (history.jsonl): append-only writer, tolerant reader, bit-exact replay."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Iterable, Mapping

import torch

from esopt.es.optimizers import OptimizerState
from esopt.es.records import Update
from esopt.es.weights import apply_update

__all__ = ["HistoryWriter", "read_history", "replay"]


def _parse_line(line: str) -> Update:
    return Update.from_json(json.loads(line))


class HistoryWriter:
    """Appends Updates to a JSONL history file, one fsynced line per update."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._repair_tail()
        self._fh = open(self.path, "a", encoding="utf-8")

    def _repair_tail(self) -> None:
        # A run killed mid-write leaves a partial last line; appending after it would glue the
        # next record onto the garbage and turn it into a corrupt middle line, so drop it now.
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if not data:
            return
        body = data[:-1] if data.endswith(b"\n") else data
        cut = body.rfind(b"\n") + 1
        last = body[cut:]
        if not last.strip():
            if not data.endswith(b"\n"):
                self._rewrite(data + b"\n")
            return
        try:
            _parse_line(last.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            self._rewrite(data[:cut])
            return
        if not data.endswith(b"\n"):
            self._rewrite(data + b"\n")

    def _rewrite(self, data: bytes) -> None:
        with open(self.path, "r+b") as fh:
            fh.seek(0)
            fh.write(data)
            fh.truncate(len(data))
            fh.flush()
            os.fsync(fh.fileno())

    def append(self, update: Update) -> None:
        """Write `update` as one JSON line, then flush and fsync."""
        line = json.dumps(update.to_json(), allow_nan=False, separators=(",", ":"))
        self._fh.write(line + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        """Close the file."""
        if not self._fh.closed:
            self._fh.close()

    def __enter__(self) -> "HistoryWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_history(path: str | os.PathLike) -> list[Update]:
    """Read all Updates from a history file, ignoring a truncated last line; ValueError on corruption."""
    path = Path(path)
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    numbered = [(i + 1, ln) for i, ln in enumerate(lines) if ln.strip()]
    updates: list[Update] = []
    for pos, (lineno, line) in enumerate(numbered):
        try:
            updates.append(_parse_line(line))
        except ValueError as e:
            if pos == len(numbered) - 1:
                warnings.warn(f"{path}:{lineno}: ignoring truncated last history line ({e})", stacklevel=2)
                break
            raise ValueError(f"{path}:{lineno}: corrupt history line: {e}") from e
    return updates


def replay(base: Mapping[str, torch.Tensor], updates: Iterable[Update]) -> dict[str, torch.Tensor]:
    """Return float32 clones of `base` with every update applied in order (base is untouched), the
    optimizer's state starting empty as in the run."""
    tensors = {name: t.detach().to(torch.float32).clone() for name, t in base.items()}
    state = OptimizerState()
    for update in updates:
        apply_update(tensors, update, state)
    return tensors
