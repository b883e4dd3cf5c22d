"""Document question answering with page tools: find a fact in a multi-page document.

Documents are generated from seeds (no data files): invoices, claim forms, shipment tables and
short reports, 2-4 pages of plain text each (configurable). Every task asks one question whose
answer is an exact span of the document: a date, an amount, a name, an id. The agent reads the
document through tools, one action per reply:

    list_pages              -> page numbers and section titles
    read_page 2             -> the text of page 2
    search invoice date     -> matching lines with page numbers (case-insensitive substring)
    answer: March 4, 2024   -> ends the episode

(`esopt.envs.tools.actions.parse_action` also accepts "read page 2", read_page(2), "Final answer: ...", etc.) A
malformed reply or a bad page number gets feedback and uses up the turn (info["invalid"]).

Reward, on the answer turn: ANLS against the gold answers (DocVQA's: 1 - normalised Levenshtein
distance, 0 when the distance is >= 0.5), or exact match with ``metric: exact``; info carries
both ("anls", "exact") and success = exact match. No answer within `max_turns` scores 0.

Splits: a (document, question) pair belongs to train or eval by a hash of its text, so the two
never overlap. Task data: ``{"kind", "title", "pages": [str], "page_titles": [str], "question",
"answers": [str], "field", "answer_page": int (1-based)}``.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from esopt.confutil import Config, ConfigError, is_int, opt
from esopt.envs.base import Env, Episode, StepResult, Task, check_split
from esopt.envs.docqa.documents import DOC_TYPES, QuestionAnswer, generate_document
from esopt.envs.metrics import anls, exact_match
from esopt.envs.splits import hash_split, short_hash, stable_int
from esopt.envs.tools.actions import ANSWER, TOOL, parse_action, truncate

TOOLS = ("list_pages", "read_page", "search")
METRICS = ("anls", "exact")


@dataclass
class DocQAConfig(Config):
    doc_types: list[str] = opt(list(DOC_TYPES), f"Document kinds to draw from: any of {', '.join(DOC_TYPES)}.")
    min_pages: int = opt(2, "Fewest pages per document (>= 1).")
    max_pages: int = opt(4, "Most pages per document (<= 6).")
    metric: str = opt("anls", "Reward metric: anls (DocVQA's, threshold below) or exact.")
    anls_threshold: float = opt(0.5, "ANLS: a normalised edit distance at or above this scores 0.")
    max_turns: int = opt(6, "Turns per episode (tool calls and the answer all count).")
    show_first_page: bool = opt(False, "Include page 1 in the first observation.")
    max_search_results: int = opt(5, "Most matching lines a search returns.")
    max_observation_chars: int = opt(1500, "Tool output longer than this is cut.")

    def check(self) -> None:
        kinds = self.doc_types
        if not isinstance(kinds, (list, tuple)) or not kinds or not all(k in DOC_TYPES for k in kinds):
            raise ConfigError(f"docqa.doc_types must be a non-empty list drawn from {list(DOC_TYPES)}, got {kinds!r}")
        self.doc_types = list(dict.fromkeys(kinds))
        for name in ("min_pages", "max_pages", "max_turns", "max_search_results", "max_observation_chars"):
            if not is_int(getattr(self, name)):
                raise ConfigError(f"docqa.{name} must be an integer, got {getattr(self, name)!r}")
        if not 1 <= self.min_pages <= self.max_pages <= 6:
            raise ConfigError(
                f"docqa.min_pages/max_pages must satisfy 1 <= min <= max <= 6, got {self.min_pages}/{self.max_pages}"
            )
        if self.metric not in METRICS:
            raise ConfigError(f"docqa.metric must be one of {list(METRICS)}, got {self.metric!r}")
        if isinstance(self.anls_threshold, bool) or not isinstance(self.anls_threshold, (int, float)) or not (
            0 < self.anls_threshold <= 1
        ):
            raise ConfigError(f"docqa.anls_threshold must be in (0, 1], got {self.anls_threshold!r}")
        if self.max_turns < 1:
            raise ConfigError(f"docqa.max_turns must be >= 1, got {self.max_turns}")
        if self.max_search_results < 1:
            raise ConfigError(f"docqa.max_search_results must be >= 1, got {self.max_search_results}")
        if self.max_observation_chars < 100:
            raise ConfigError(f"docqa.max_observation_chars must be >= 100, got {self.max_observation_chars}")
        if not isinstance(self.show_first_page, bool):
            raise ConfigError(f"docqa.show_first_page must be true or false, got {self.show_first_page!r}")


class DocQAEnv(Env):
    """Answer a question about a generated multi-page document using page tools."""

    name = "docqa"
    Config = DocQAConfig
    config: DocQAConfig

    @property
    def max_turns(self) -> int:
        return self.config.max_turns

    @property
    def system_prompt(self) -> str:
        return "\n".join([
            "Answer a question about a document. You cannot see the document; use the tools.",
            "Each reply must be ONE of these lines:",
            "list_pages   (shows the page titles)",
            "read_page <n>   (example: read_page 2)",
            "search <words>   (example: search due date)",
            "answer: <text copied exactly from the document>",
            f"You have {self.config.max_turns} turns; reply with answer: before they run out.",
        ])

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        check_split(split)
        if not is_int(n) or n < 0:
            raise ValueError(f"n must be a non-negative integer, got {n!r}")
        c = self.config
        out: list[Task] = []
        seen: set[str] = set()
        attempt = 0
        while len(out) < n:
            if attempt > 200 * n + 1000:
                raise RuntimeError(f"docqa: could not draw {n} distinct {split} tasks")
            rng = random.Random(stable_int(f"esopt-docqa|{split}|{seed}|{attempt}"))
            attempt += 1
            kind = rng.choice(c.doc_types)
            doc = generate_document(kind, rng, rng.randint(c.min_pages, c.max_pages))
            qa: QuestionAnswer = rng.choice(doc["qas"])
            text = "\n\f\n".join(doc["pages"])
            key = f"{text}\n\f\n{qa.question}"
            if key in seen or hash_split("docqa", key) != split:
                continue
            seen.add(key)
            anchor = qa.anchor or qa.answer
            page = next(
                i for i, p in enumerate(doc["pages"], 1)
                if any(qa.answer in line and anchor in line for line in p.split("\n"))
            )
            out.append(Task(
                id=f"docqa-{kind}-{short_hash(key)}",
                data={
                    "kind": kind, "title": doc["title"], "pages": doc["pages"],
                    "page_titles": doc["page_titles"], "question": qa.question,
                    "answers": qa.golds(), "field": qa.field, "answer_page": page,
                },
            ))
        return out

    def start(self, task: Task) -> "DocQAEpisode":
        return DocQAEpisode(self, task)


_INT = re.compile(r"-?\d+")


class DocQAEpisode(Episode):
    def __init__(self, env: DocQAEnv, task: Task):
        self.env = env
        self.config: DocQAConfig = env.config
        self.task = task
        self.pages: list[str] = list(task.data["pages"])
        self.titles: list[str] = list(task.data.get("page_titles") or [f"page {i}" for i in range(1, len(self.pages) + 1)])
        self.golds: list[str] = list(task.data["answers"])
        self.turn = 0
        self.tool_calls = 0
        self.done = False
        n = len(self.pages)
        obs = [
            f"Document: {task.data.get('title', 'untitled')} ({n} page{'s' if n != 1 else ''}).",
            f"Question: {task.data['question']}",
        ]
        if self.config.show_first_page and self.pages:
            obs.append(f"Page 1 of {n}:\n{self.pages[0]}")
        obs.append("Use list_pages, read_page <n> or search <words>; reply answer: <text> when you know.")
        self._observation = "\n".join(obs)

    @property
    def observation(self) -> str:
        return self._observation

    def _list_pages(self) -> str:
        return "Pages:\n" + "\n".join(f"{i}: {t}" for i, t in enumerate(self.titles, 1))

    def _read_page(self, arg: str) -> tuple[str, bool]:
        n = len(self.pages)
        m = _INT.search(arg or "")
        if not m or len(m.group()) > 6:
            return f"read_page needs a page number 1-{n}, e.g. read_page 1", False
        k = int(m.group())
        if not 1 <= k <= n:
            return f"There is no page {k}; pages are 1-{n}.", False
        return truncate(f"Page {k} of {n}:\n{self.pages[k - 1]}", self.config.max_observation_chars), True

    def _search(self, arg: str) -> tuple[str, bool]:
        q = " ".join((arg or "").split()).strip("\"'`")
        if not q:
            return "search needs some words, e.g. search total", False
        if len(q) > 200:
            return "search text too long (max 200 characters)", False
        hits = self._hits(q)
        if not hits and q.lower().startswith("for "):
            q = q[4:].strip()
            hits = self._hits(q)
        if not hits:
            return f"No lines contain '{q}'.", True
        k = self.config.max_search_results
        lines = [f"p{p}: {truncate(line, 200)}" for p, line in hits[:k]]
        if len(hits) > k:
            lines.append(f"... and {len(hits) - k} more")
        return truncate(f"Lines containing '{q}':\n" + "\n".join(lines), self.config.max_observation_chars), True

    def _hits(self, q: str) -> list[tuple[int, str]]:
        ql = q.lower()
        return [
            (p, line) for p, page in enumerate(self.pages, 1) for line in page.split("\n")
            if ql in " ".join(line.split()).lower()
        ]

    def step(self, action: str) -> StepResult:
        if self.done:
            return StepResult(self._observation, 0.0, True, {"invalid": True, "error": "the episode is already over"})
        c = self.config
        self.turn += 1
        info: dict = {"invalid": False, "turn": self.turn}
        act = parse_action(action, TOOLS)
        if act.kind == ANSWER and act.arg.strip():
            pred = act.arg.strip()
            a = anls(pred, self.golds, threshold=c.anls_threshold)
            e = exact_match(pred, self.golds)
            reward = a if c.metric == "anls" else e
            self.done = True
            info.update(success=e == 1.0, answer=pred, anls=a, exact=e, tool_calls=self.tool_calls)
            self._observation = ("Correct!" if e == 1.0 else "Answer recorded.") + " The episode is over."
            return StepResult(self._observation, float(reward), True, info)
        if act.kind == TOOL:
            self.tool_calls += 1
            info["tool"] = act.tool
            if act.tool == "list_pages":
                feedback, ok = self._list_pages(), True
            elif act.tool == "read_page":
                feedback, ok = self._read_page(act.arg)
            else:
                feedback, ok = self._search(act.arg)
            if not ok:
                info["invalid"] = True
                info["error"] = feedback
        else:
            info["invalid"] = True
            info["error"] = "empty answer" if act.kind == ANSWER else (act.error or "unreadable reply")
            feedback = (
                f"Invalid reply ({info['error']}). Reply with one of: list_pages | read_page <n> | "
                "search <words> | answer: <text>"
            )
        if self.turn >= c.max_turns:
            self.done = True
            info.update(success=False, answer=None, anls=0.0, exact=0.0, tool_calls=self.tool_calls)
            self._observation = f"{feedback}\nOut of turns without an answer. The episode is over."
            return StepResult(self._observation, 0.0, True, info)
        left = c.max_turns - self.turn
        note = "Last turn: reply with answer: <text>." if left == 1 else f"Turns left: {left}."
        self._observation = f"{feedback}\n{note}"
        return StepResult(self._observation, 0.0, False, info)
