"""A skill document: markdown made of `## ` sections, placed in an agent's system prompt.

    <!-- esopt-skill v3 -->          (optional header line: the version; not shown to the agent)
    # Skill: countdown               (optional title line)
    Free text before the first section (the preamble).

    ## Strategy
    - Try the largest numbers first.

    ## Mistakes to avoid
    - ...

Sections are identified by their title (compared case- and whitespace-insensitively), so titles are
unique. `Skill.tag` ("v3-1a2b3c4d": version + hash of the content) is what a trajectory records.
`validate(limits)` raises SkillError (a ValueError) naming what is wrong.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from esopt.confutil import Config, ConfigError, opt

_HEADER = re.compile(r"^<!--\s*esopt-skill\s+v(\d+)\s*-->\s*$")
_SECTION = re.compile(r"^##\s+(.*?)\s*#*\s*$")
MAX_TITLE_CHARS = 80


class SkillError(ValueError):
    """A skill document or a patch that breaks the skill's rules; the message says which rule."""


def title_key(title: str) -> str:
    """The identity of a section title: lower-cased, whitespace collapsed, edge punctuation dropped."""
    return " ".join(str(title).lower().split()).strip(" .:;,-")


@dataclass
class SkillLimits(Config):
    max_chars: int = opt(3000, "largest skill document (rendered characters) a distillation may produce")
    max_sections: int = opt(10, "most `## ` sections a skill document may have")
    max_section_chars: int = opt(800, "longest body of one section, characters")

    def check(self) -> None:
        for name in ("max_chars", "max_sections", "max_section_chars"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ConfigError(f"limits.{name} must be an integer >= 1, got {getattr(self, name)!r}")


@dataclass
class Section:
    title: str
    body: str = ""

    @property
    def key(self) -> str:
        return title_key(self.title)


@dataclass
class Skill:
    title: str = ""
    """The `# ` line without its marker (may be empty)."""
    preamble: str = ""
    sections: list[Section] = field(default_factory=list)
    version: int = 0

    # ---- parse / render ------------------------------------------------------------------------
    @classmethod
    def parse(cls, text: str, version: int | None = None) -> "Skill":
        lines = str(text).replace("\r\n", "\n").split("\n")
        found_version = 0
        if lines and _HEADER.match(lines[0].strip()):
            found_version = int(_HEADER.match(lines[0].strip()).group(1))
            lines = lines[1:]
        title = ""
        preamble: list[str] = []
        sections: list[Section] = []
        body: list[str] = []
        in_fence = False
        for line in lines:
            if line.strip().startswith("```"):
                in_fence = not in_fence
            heading = None if in_fence else _SECTION.match(line)
            if heading and not line.startswith("###"):
                if sections:
                    sections[-1].body = _clean("\n".join(body))
                else:
                    preamble = body
                sections.append(Section(heading.group(1).strip()))
                body = []
            elif not sections and not title and not body and not in_fence and re.match(r"^#\s+\S", line):
                title = line[1:].strip()
            else:
                body.append(line)
        if sections:
            sections[-1].body = _clean("\n".join(body))
        else:
            preamble = body
        return cls(title, _clean("\n".join(preamble)), sections, found_version if version is None else version)

    def render(self, header: bool = False) -> str:
        """The markdown; with `header`, the version comment first (the file form)."""
        parts = []
        if header:
            parts.append(f"<!-- esopt-skill v{self.version} -->")
        if self.title:
            parts.append(f"# {self.title}")
        if self.preamble:
            parts.append(self.preamble)
        head = "\n".join(parts)
        blocks = [head] if head else []
        for s in self.sections:
            blocks.append(f"## {s.title}\n{s.body}".rstrip())
        return "\n\n".join(blocks).strip() + "\n"

    @property
    def text(self) -> str:
        """What the agent sees (no version header)."""
        return self.render(header=False)

    @property
    def content_hash(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()[:8]

    @property
    def tag(self) -> str:
        """Version and content hash, e.g. "v3-1a2b3c4d": recorded by every trajectory that used it."""
        return f"v{self.version}-{self.content_hash}"

    # ---- queries -------------------------------------------------------------------------------
    def titles(self) -> list[str]:
        return [s.title for s in self.sections]

    def find(self, title: str) -> int | None:
        key = title_key(title)
        for i, s in enumerate(self.sections):
            if s.key == key:
                return i
        return None

    def section(self, title: str) -> Section | None:
        i = self.find(title)
        return None if i is None else self.sections[i]

    def copy(self, **changes) -> "Skill":
        return replace(self, sections=[Section(s.title, s.body) for s in self.sections], **changes)

    # ---- validation ----------------------------------------------------------------------------
    def problems(self, limits: SkillLimits | None = None) -> list[str]:
        """Every rule the document breaks (empty = valid)."""
        limits = limits or SkillLimits()
        out = []
        text = self.text
        if len(text) > limits.max_chars:
            out.append(f"the skill has {len(text)} characters, more than the limit of {limits.max_chars}")
        if len(self.sections) > limits.max_sections:
            out.append(f"the skill has {len(self.sections)} sections, more than the limit of {limits.max_sections}")
        seen: set[str] = set()
        for s in self.sections:
            if not s.key:
                out.append("a section has an empty title")
            elif "\n" in s.title or len(s.title) > MAX_TITLE_CHARS:
                out.append(f"section title {s.title[:40]!r} must be one line of at most {MAX_TITLE_CHARS} characters")
            if s.key in seen:
                out.append(f"section {s.title!r} appears twice")
            seen.add(s.key)
            if len(s.body) > limits.max_section_chars:
                out.append(
                    f"section {s.title!r} has {len(s.body)} characters, more than the limit of {limits.max_section_chars}"
                )
        return out

    def validate(self, limits: SkillLimits | None = None) -> "Skill":
        problems = self.problems(limits)
        if problems:
            raise SkillError("; ".join(problems))
        return self

    # ---- files ---------------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write the file form (with the version header) atomically."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.render(header=True))
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Skill":
        path = Path(path)
        if not path.is_file():
            raise SkillError(f"skill document not found: {path}")
        return cls.parse(path.read_text())


def _clean(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").split("\n")).strip()


_CACHE: dict[str, tuple[tuple[int, int], Skill]] = {}


def load_cached(path: str | Path) -> Skill:
    """Skill.load, re-read only when the file changes (by mtime and size): rollouts call this every
    episode batch, and a co-evolution loop rewrites the file between steps."""
    path = Path(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise SkillError(f"skill document not found: {path}") from None
    stamp = (st.st_mtime_ns, st.st_size)
    key = str(path.resolve())
    hit = _CACHE.get(key)
    if hit is None or hit[0] != stamp:
        hit = (stamp, Skill.load(path))
        _CACHE[key] = hit
    return hit[1]


def seed_skill(env_name: str) -> Skill:
    """The starting document of a distillation when none is given: a title and two short sections
    that analysts extend (append/replace) or reorganise (insert/delete)."""
    return Skill(
        title=f"Skill: {env_name}",
        preamble="Notes distilled from earlier episodes. Follow them.",
        sections=[
            Section("What works", "- Follow the reply format of the task exactly."),
            Section("Mistakes to avoid", "- Do not add text around the action."),
        ],
    )
