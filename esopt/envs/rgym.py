"""Any reasoning-gym dataset as an env, or a weighted mixture of them for multi-task ES.

    esopt train --env reasoning_gym --env.dataset word_sorting
    esopt train --env reasoning_gym --env.datasets chain_sum:2,leg_counting:1,word_sorting:1
    esopt train --env reasoning_gym --env.dataset letter_counting --env.attempts 3   # multi-turn: retry on feedback

Problems come from reasoning-gym's procedural generators (offline, seeded). The agent sees the
dataset's own question under reasoning-gym's own system prompt (`system_prompt` picks one of
reasoning_gym.utils.SYSTEM_PROMPTS), answers between <answer> and </answer>, and is scored by the
dataset's own `score_answer` (a number in [0, 1]; success = score >= `success_threshold`).
One-turn (`attempts: 1`, the default): the first reply is the answer. Multi-turn (`attempts: k`):
a reply that is not a success gets its score as feedback and the agent answers again, up to k
times; the episode's reward is the last answer's score times `retry_discount` per retry.

Splits: a question belongs to train, val or eval by a hash of (dataset, question text), so the
three never overlap whatever the seeds or the mixture; generator seeds also differ per (split,
seed), and questions are de-duplicated within a call.

The catalogue (`esopt envs`): every dataset reasoning-gym registers, probed once (two items made
offline, the reference answer scored) and cached per reasoning-gym version; a dataset that cannot
be made here is listed as excluded with the reason, and asking for it is a one-line error.

Task data: ``{"dataset", "stream_seed", "stream_size", "index", "question", "answer"}``; the
generator's full record (which its scorer reads, metadata included) is made again from the first
four when an answer is scored.
"""

from __future__ import annotations

import collections
import contextlib
import io
import json
import os
import random
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from esopt.confutil import Config, ConfigError, cache_root, opt
from esopt.envs.base import Env, Episode, StepResult, Task, check_split
from esopt.envs.splits import hash_split, short_hash, stable_int

MIXTURE_HELP = "name:weight,... (weight 1 when left out)"
_RESERVED_OPTIONS = {"seed", "size"}
_MAX_STREAM = 100_000  # some generators build every item when created: size their streams to the request
_NOT_A_DATASET = {"composite": f"a mixture of datasets itself: use --env.datasets {MIXTURE_HELP}"}


def _reasoning_gym():
    try:
        import reasoning_gym  # imported lazily: only this env needs it
    except ImportError:
        raise ConfigError("the reasoning_gym env needs reasoning-gym: pip install 'esopt[envs]'") from None
    return reasoning_gym


def _one_line(error: BaseException) -> str:
    return " ".join(f"{type(error).__name__}: {error}".split())[:200]


@contextlib.contextmanager
def _quiet():
    """Some generators print progress (bf prints dots) or warn while making items: keep esopt's output clean."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


def _make(name: str, seed: int, size: int, options: dict):
    with _quiet():
        return _reasoning_gym().create_dataset(name, seed=seed, size=size, **options)


def probe(name: str, options: dict | None = None) -> str | None:
    """Why dataset `name` cannot be used here (one line), or None when it makes and scores items offline."""
    if name in _NOT_A_DATASET:
        return _NOT_A_DATASET[name]
    try:
        dataset = _make(name, 0, 4, dict(options or {}))
        for index in range(2):
            with _quiet():
                entry = dataset[index]
            if not isinstance(entry.get("question"), str) or not entry["question"].strip():
                return "its items have no question text"
            json.dumps({"question": entry["question"], "answer": entry.get("answer")})
            if entry.get("answer") is not None:
                score = float(dataset.score_answer(str(entry["answer"]), entry))
                if not 0.0 <= score <= 1.0:
                    return f"its scorer returned {score}, outside [0, 1]"
    except Exception as e:  # whatever a third-party generator raises: excluded, with the reason
        return f"cannot be generated offline here ({_one_line(e)})"
    return None


def _catalogue_path() -> Path:
    return cache_root() / "reasoning_gym" / f"catalogue-{_reasoning_gym().__version__}.json"


def catalogue() -> dict[str, dict]:
    """Every registered reasoning-gym dataset -> {"category", "excluded": reason or None}; probed once per
    reasoning-gym version and cached (ESOPT_CACHE, default ~/.cache/esopt)."""
    from reasoning_gym.factory import DATASETS

    path = _catalogue_path()
    try:
        cached = json.loads(path.read_text())
        if set(cached) == set(DATASETS):
            return cached
    except (OSError, ValueError):
        pass
    entries = {
        name: {"category": DATASETS[name][0].__module__.split(".")[1], "excluded": probe(name)} for name in sorted(DATASETS)
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_suffix(f".{os.getpid()}.tmp")
    staging.write_text(json.dumps(entries, indent=1))
    staging.replace(path)
    return entries


def usable_datasets() -> list[str]:
    return [name for name, entry in catalogue().items() if not entry["excluded"]]


def _parse_mixture(items: list[str]) -> dict[str, float]:
    mixture: dict[str, float] = {}
    for item in items:
        name, _, weight = item.strip().partition(":")
        name = name.strip()
        try:
            value = float(weight) if weight.strip() else 1.0
        except ValueError:
            raise ConfigError(f"reasoning_gym.datasets: bad weight in {item!r}; expected {MIXTURE_HELP}") from None
        if not name or value < 0 or value != value:
            raise ConfigError(f"reasoning_gym.datasets: bad entry {item!r}; expected {MIXTURE_HELP} with weights >= 0")
        if name in mixture:
            raise ConfigError(f"reasoning_gym.datasets names {name!r} twice")
        mixture[name] = value
    if mixture and sum(mixture.values()) <= 0:
        raise ConfigError("reasoning_gym.datasets: the weights must not all be 0")
    return mixture


@dataclass
class ReasoningGymConfig(Config):
    dataset: str | None = opt("letter_counting", "one reasoning-gym dataset (`esopt envs` lists them); ignored when datasets is set")
    datasets: list[str] = opt(
        [], f"a weighted mixture of datasets for multi-task ES: {MIXTURE_HELP}, e.g. chain_sum:2,word_sorting:1"
    )
    dataset_options: dict = opt(
        {}, "per-dataset generator options (difficulty knobs; not seed/size), e.g. {chain_sum: {max_terms: 3}}"
    )
    system_prompt: str = opt(
        "default", "which of reasoning-gym's system prompts frames the question: default, direct, simple, chain_of_draft, DeepSeekZero"
    )
    attempts: int = opt(1, "answers per task: 1 = one turn; k > 1 = multi-turn, a wrong answer gets its score back and the agent retries")
    retry_discount: float = opt(1.0, "multi-turn: the final answer's score is multiplied by this once per retry before it")
    success_threshold: float = opt(1.0, "a score at or above this is a success (and ends a multi-turn episode)")

    def check(self) -> None:
        if not isinstance(self.datasets, list) or not all(isinstance(d, str) for d in self.datasets):
            raise ConfigError(f"reasoning_gym.datasets must be a list like [{MIXTURE_HELP}], got {self.datasets!r}")
        if not self.datasets and not self.dataset:
            raise ConfigError("reasoning_gym needs dataset NAME or datasets name:weight,... (`esopt envs` lists them)")
        if not isinstance(self.dataset_options, dict) or not all(isinstance(v, dict) for v in self.dataset_options.values()):
            raise ConfigError(f"reasoning_gym.dataset_options must map dataset names to option mappings, got {self.dataset_options!r}")
        from reasoning_gym.factory import DATASETS
        from reasoning_gym.utils import SYSTEM_PROMPTS

        for name in self.mixture:
            if name not in DATASETS:
                raise ConfigError(f"reasoning_gym: unknown dataset {name!r}; `esopt envs` lists the {len(DATASETS)} datasets")
        for name, options in self.dataset_options.items():
            if name not in self.mixture:
                raise ConfigError(f"reasoning_gym.dataset_options.{name}: {name!r} is not among the datasets {list(self.mixture)}")
            bad = sorted(_RESERVED_OPTIONS & set(options))
            if bad:
                raise ConfigError(f"reasoning_gym.dataset_options.{name}: {', '.join(bad)} is set by the env")
        for name in self.mixture:
            reason = probe(name, self.dataset_options.get(name))
            if reason:
                raise ConfigError(f"reasoning_gym dataset {name!r} is unavailable: {reason}")
        if self.system_prompt not in SYSTEM_PROMPTS:
            raise ConfigError(f"reasoning_gym.system_prompt must be one of {', '.join(SYSTEM_PROMPTS)}, got {self.system_prompt!r}")
        if not isinstance(self.attempts, int) or self.attempts < 1:
            raise ConfigError(f"reasoning_gym.attempts must be an integer >= 1, got {self.attempts!r}")
        if not 0 <= self.retry_discount <= 1:
            raise ConfigError(f"reasoning_gym.retry_discount must be in [0, 1], got {self.retry_discount!r}")
        if not 0 < self.success_threshold <= 1:
            raise ConfigError(f"reasoning_gym.success_threshold must be in (0, 1], got {self.success_threshold!r}")

    @property
    def mixture(self) -> dict[str, float]:
        """Dataset -> sampling weight (a single dataset has weight 1)."""
        return _parse_mixture(self.datasets) if self.datasets else {str(self.dataset): 1.0}


class ReasoningGymEnv(Env):
    """reasoning-gym datasets (one or a weighted mixture), their own prompts and scorers; optional retries."""

    name = "reasoning_gym"
    Config = ReasoningGymConfig
    config: ReasoningGymConfig

    def __init__(self, config: ReasoningGymConfig | None = None):
        super().__init__(config)
        self.mixture = self.config.mixture
        self._streams: dict[tuple[str, int, int], Any] = {}

    @classmethod
    def listing(cls) -> list[str]:
        entries = catalogue()
        by_category: dict[str, list[str]] = collections.defaultdict(list)
        for name, entry in entries.items():
            if not entry["excluded"]:
                by_category[entry["category"]].append(name)
        lines = [f"datasets ({sum(map(len, by_category.values()))} usable; --env.dataset NAME or --env.datasets {MIXTURE_HELP}):"]
        lines += [f"  {category}: {', '.join(names)}" for category, names in sorted(by_category.items())]
        lines += [f"excluded: {name}: {entry['excluded']}" for name, entry in entries.items() if entry["excluded"]]
        return lines

    @property
    def max_turns(self) -> int:
        return self.config.attempts

    @property
    def system_prompt(self) -> str:
        from reasoning_gym.utils import SYSTEM_PROMPTS

        prompt = SYSTEM_PROMPTS[self.config.system_prompt].strip()
        if self.config.attempts > 1:
            prompt += (
                f"\nYou have {self.config.attempts} attempts: when an answer is not right you are told its score "
                "(1 is fully right) and may answer again."
            )
        return prompt

    def _stream(self, name: str, seed: int, size: int):
        key = (name, seed, size)
        if key not in self._streams:
            if len(self._streams) > 64:
                self._streams.clear()
            self._streams[key] = _make(name, seed, size, dict(self.config.dataset_options.get(name, {})))
        return self._streams[key]

    def entry(self, task: Task) -> dict:
        """The generator's full record of `task` (what its scorer reads), made again from the task's seed."""
        d = task.data
        stream = self._stream(d["dataset"], d["stream_seed"], d["stream_size"])
        with _quiet():
            return stream[d["index"]]

    def score(self, task: Task, answer: str) -> float:
        """The dataset's own score of `answer` for `task`, in [0, 1] (0 when its scorer fails)."""
        dataset = self._stream(task.data["dataset"], task.data["stream_seed"], task.data["stream_size"])
        try:
            entry = self.entry(task)
            with _quiet():
                return min(1.0, max(0.0, float(dataset.score_answer(answer, entry))))
        except Exception:
            return 0.0

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        check_split(split)
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be a non-negative integer, got {n!r}")
        names, weights = list(self.mixture), list(self.mixture.values())
        size = min(_MAX_STREAM, max(64, 16 * n))  # a held-out split gets about 1 item in 4
        rng = random.Random(stable_int(f"esopt-rgym|{split}|{seed}"))
        stream_seeds = {name: stable_int(f"esopt-rgym-gen|{name}|{split}|{seed}") % 2**31 for name in names}
        cursor = dict.fromkeys(names, 0)
        seen: set[tuple[str, str]] = set()
        out: list[Task] = []
        while len(out) < n:
            live = [(name, w) for name, w in zip(names, weights) if cursor[name] < size and w > 0]
            if not live:
                raise ConfigError(
                    f"reasoning_gym: could not draw {n} distinct {split} questions from {', '.join(names)}; "
                    "their settings allow too few different questions"
                )
            name = rng.choices([m for m, _ in live], weights=[w for _, w in live])[0]
            index = cursor[name]
            cursor[name] += 1
            try:
                stream = self._stream(name, stream_seeds[name], size)
                with _quiet():
                    entry = stream[index]
            except Exception:  # a generator that fails on this index: skip it
                continue
            question = str(entry["question"])
            key = " ".join(question.split())
            if (name, key) in seen or hash_split(f"reasoning_gym|{name}", key) != split:
                continue
            seen.add((name, key))
            answer = entry.get("answer")
            out.append(
                Task(
                    id=f"rg-{name}-{short_hash(key)}",
                    data={
                        "dataset": name,
                        "stream_seed": stream_seeds[name],
                        "stream_size": size,
                        "index": index,
                        "question": question,
                        "answer": None if answer is None else str(answer),
                    },
                )
            )
        return out

    def trivial_baseline(self, tasks: list[Task]) -> tuple[str, float] | None:
        """Always giving the most frequent reference answer of `tasks`, scored by each dataset's scorer."""
        answers = collections.Counter(t.data["answer"] for t in tasks if t.data["answer"] is not None)
        if not answers:
            return None
        answer = answers.most_common(1)[0][0]
        solved = sum(self.score(t, answer) >= self.config.success_threshold for t in tasks)
        return f"always {answer[:40]!r}", solved / len(tasks)

    def oracle(self, task: Task):
        """Answer with the dataset's reference answer (none for the few datasets that score any valid answer)."""
        answer = task.data["answer"]
        return None if answer is None else (lambda observation: f"<answer>{answer}</answer>")

    def start(self, task: Task) -> "ReasoningGymEpisode":
        return ReasoningGymEpisode(self, task)


class ReasoningGymEpisode(Episode):
    def __init__(self, env: ReasoningGymEnv, task: Task):
        self.env = env
        self.task = task
        self.attempt = 0
        self.done = False
        self._observation = task.data["question"].strip()

    @property
    def observation(self) -> str:
        return self._observation

    def step(self, action: str) -> StepResult:
        from reasoning_gym.utils import extract_answer

        c = self.env.config
        if self.done:
            return StepResult(self._observation, 0.0, True, {"invalid": True, "error": "the episode is already over"})
        self.attempt += 1
        answer = extract_answer(action or "")
        info: dict = {"invalid": answer is None, "turn": self.attempt}
        score = 0.0 if answer is None else self.env.score(self.task, answer)
        success = score >= c.success_threshold
        left = c.attempts - self.attempt
        if success or left == 0:
            self.done = True
            info.update(success=success, answer=answer, score=score, category=self.task.data["dataset"])
            reward = score * c.retry_discount ** (self.attempt - 1)
            self._observation = f"{'Correct' if success else 'Not right'} (score {score:.2f}). The episode is over."
            return StepResult(self._observation, float(reward), True, info)
        if answer is None:
            feedback = "No answer found: give the final answer between <answer> and </answer>."
        else:
            feedback = f"Your answer scored {score:.2f} (1 is fully right)."
        self._observation = f"{feedback} Try again; {left} attempt{'s' if left > 1 else ''} left."
        return StepResult(self._observation, 0.0, False, info)
