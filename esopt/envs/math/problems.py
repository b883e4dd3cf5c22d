"""Math problems drawn from reasoning-gym's procedural generators (offline, seeded), per split.

A problem belongs to train, val or eval by a hash of its question text, so the splits never overlap
whatever the seeds; generator seeds also differ per (split, seed), and questions are de-duplicated
within a call.

Task data: ``{"generator", "question", "answer", "entry"}`` where ``entry`` is the generator's
JSON-safe record (question, answer, metadata) that its scorer reads.
"""

from __future__ import annotations

import json
import random
from typing import Any

from esopt.envs.base import Task
from esopt.envs.splits import hash_split, short_hash, stable_int

DEFAULT_GENERATORS = ["basic_arithmetic", "gsm_symbolic", "simple_equations"]
RESERVED_OPTIONS = {"seed", "size"}
_DATASET_SIZE = 200_000  # virtual size of each generator stream (items are made on demand)


def generator_registry() -> dict:
    from reasoning_gym.factory import DATASETS  # imported lazily: only this env needs it

    return DATASETS


def create_dataset(name: str, seed: int, size: int, options: dict):
    import reasoning_gym

    return reasoning_gym.create_dataset(name, seed=seed, size=size, **options)


def _json_safe(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))


class Problems:
    """The generators of one env's settings: their streams and scorers, made on demand and cached."""

    def __init__(self, generators: list[str], weights: list[float] | None, generator_options: dict):
        self.generators = generators
        self.weights = weights
        self.generator_options = generator_options
        self._streams: dict[tuple[str, int], Any] = {}
        self._scorers: dict[str, Any] = {}

    def _options(self, name: str) -> dict:
        return dict(self.generator_options.get(name, {}))

    def _stream(self, name: str, seed: int):
        key = (name, seed)
        if key not in self._streams:
            if len(self._streams) > 64:
                self._streams.clear()
            self._streams[key] = create_dataset(name, seed, _DATASET_SIZE, self._options(name))
        return self._streams[key]

    def scorer(self, name: str):
        """A dataset object of generator `name`, used only for its `score_answer`."""
        if name not in self._scorers:
            try:
                self._scorers[name] = create_dataset(name, 0, 1, self._options(name))
            except Exception:
                self._scorers[name] = None
        return self._scorers[name]

    def draw(self, split: str, n: int, seed: int) -> list[Task]:
        """`n` distinct problems of `split`, the same for the same (split, n, seed)."""
        rng = random.Random(stable_int(f"esopt-math|{split}|{seed}"))
        gens = self.generators
        streams = {g: self._stream(g, stable_int(f"esopt-math-gen|{g}|{split}|{seed}") % 2**31) for g in gens}
        cursor = {g: 0 for g in gens}
        seen: set[str] = set()
        out: list[Task] = []
        budget = 200 * n + 1000
        while len(out) < n:
            budget -= 1
            if budget < 0:
                raise RuntimeError(
                    f"math: could not draw {n} distinct {split} problems from {gens}; "
                    "the generators' settings allow too few different questions"
                )
            gen = rng.choices(gens, weights=self.weights)[0]
            idx = cursor[gen]
            cursor[gen] += 1
            if idx >= _DATASET_SIZE:
                continue
            try:
                entry = streams[gen][idx]
            except Exception:  # a generator that fails on this index: skip it
                continue
            question = " ".join(str(entry["question"]).split())
            if question in seen or hash_split("math", question) != split:
                continue
            seen.add(question)
            entry = _json_safe({"question": entry["question"], "answer": entry["answer"], "metadata": entry.get("metadata", {})})
            out.append(
                Task(
                    id=f"math-{gen}-{short_hash(question)}",
                    data={
                        "generator": gen,
                        "question": str(entry["question"]),
                        "answer": str(entry["answer"]),
                        "entry": entry,
                    },
                )
            )
        return out
