"""Patches against a frozen skill snapshot, their application, and their hierarchical merge.

An `Edit` names one section of the base skill (by title) and one operation:

- `insert`: add a new section `section` with body `content`, placed after the section `after`
  (None = at the end). The title must not exist in the base.
- `append`: add the lines of `content` at the end of an existing section.
- `replace`: make `content` the whole body of an existing section.
- `delete`: remove an existing section.

A `Patch` is a list of edits proposed by one analyst reading one trajectory, always against the
same frozen snapshot (the skill as it was when the distillation began), so patches never depend on
each other and merge in any grouping.

Merging (`merge`), per target section, with `support` = how many source patches back an edit:

- appends and inserts of the same new title: their lines are united (duplicate lines, compared
  case- and bullet-insensitively, kept once); an insert keeps the first proposer's title and place.
- delete vs replace/append ("delete-vs-edit"): the side with more support wins; a tie keeps the
  section (the non-destructive choice).
- replace vs replace with different contents ("replace-vs-replace"): the content with the most
  support wins; a tie goes to the later patch.
- replace + append: the winning replacement, followed by the appended lines it does not contain.

Every conflict is recorded (section, kind, winner, the losing proposals, votes). The result has at
most one edit per section, so merging merged patches applies the same rules with their summed
support: `hierarchical_merge` merges groups of k patches, then groups of the merged patches, until
one remains. Everything is deterministic in the order of the patches.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from esopt.skills.document import MAX_TITLE_CHARS, Section, Skill, SkillError, title_key

OPS = ("insert", "append", "replace", "delete")
_HEADING_LINE = re.compile(r"^\s{0,3}#{1,2}\s", re.MULTILINE)


@dataclass
class Edit:
    op: str
    section: str
    content: str = ""
    after: str | None = None
    """insert only: the base section the new one follows (None = at the end)."""
    support: int = 1

    @property
    def key(self) -> str:
        return title_key(self.section)

    def to_json(self) -> dict:
        out = {"op": self.op, "section": self.section}
        if self.op != "delete":
            out["content"] = self.content
        if self.op == "insert" and self.after:
            out["after"] = self.after
        if self.support != 1:
            out["support"] = self.support
        return out


@dataclass
class Patch:
    edits: list[Edit] = field(default_factory=list)
    source: str = ""
    """Where it came from: a trajectory id, or "merge(...)"."""

    def to_json(self) -> dict:
        return {"source": self.source, "edits": [e.to_json() for e in self.edits]}

    def __bool__(self) -> bool:
        return bool(self.edits)


@dataclass
class Conflict:
    section: str
    kind: str
    """"delete-vs-edit" or "replace-vs-replace"."""
    winner: str
    losers: list[str]
    votes: dict

    def to_json(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------------------------------- checks
def check_edit(edit: Edit, base: Skill, max_edit_chars: int = 600) -> str | None:
    """Why `edit` cannot apply to `base` (None = it can)."""
    if edit.op not in OPS:
        return f"unknown op {edit.op!r}; expected one of {', '.join(OPS)}"
    if not isinstance(edit.section, str) or not edit.key:
        return "the edit names no section"
    if "\n" in edit.section or len(edit.section) > MAX_TITLE_CHARS:
        return f"section title must be one line of at most {MAX_TITLE_CHARS} characters"
    exists = base.find(edit.section) is not None
    if edit.op == "insert" and exists:
        return f"insert: section {edit.section!r} already exists (use append or replace)"
    if edit.op in ("append", "replace", "delete") and not exists:
        known = ", ".join(repr(t) for t in base.titles()) or "none"
        return f"{edit.op}: no section {edit.section!r} in the skill (sections: {known})"
    if edit.op == "insert" and edit.after and base.find(edit.after) is None:
        return f"insert: no section {edit.after!r} to insert after"
    if edit.op != "delete":
        if not isinstance(edit.content, str) or not edit.content.strip():
            return f"{edit.op}: empty content"
        if len(edit.content) > max_edit_chars:
            return f"{edit.op}: content has {len(edit.content)} characters, more than the limit of {max_edit_chars}"
        if _HEADING_LINE.search(edit.content):
            return f"{edit.op}: content must not contain '#' or '##' headings (one edit changes one section)"
    return None


def check_patch(patch: Patch, base: Skill, max_edit_chars: int = 600) -> str | None:
    """Why `patch` cannot apply to `base` (None = it can): the first bad edit, or two edits on one section."""
    seen: set[str] = set()
    for i, edit in enumerate(patch.edits):
        reason = check_edit(edit, base, max_edit_chars)
        if reason:
            return f"edit {i + 1}: {reason}" if len(patch.edits) > 1 else reason
        if edit.key in seen:
            return f"edit {i + 1}: section {edit.section!r} is edited twice in one patch"
        seen.add(edit.key)
    return None


# ------------------------------------------------------------------------------------------ apply
def apply_patch(base: Skill, patch: Patch) -> Skill:
    """The skill after `patch` (at most one edit per section, all against `base`). The version is
    unchanged (the caller versions the result). Raises SkillError when an edit cannot apply."""
    reason = check_patch(patch, base, max_edit_chars=10**9)
    if reason:
        raise SkillError(reason)
    by_key = {e.key: e for e in patch.edits if e.op != "insert"}
    inserts_after: dict[str | None, list[Edit]] = {}
    for e in patch.edits:
        if e.op == "insert":
            anchor = base.find(e.after) if e.after else None
            inserts_after.setdefault(anchor, []).append(e)
    out = base.copy()
    sections: list[Section] = []
    for i, s in enumerate(base.sections):
        edit = by_key.get(s.key)
        if edit is None:
            sections.append(Section(s.title, s.body))
        elif edit.op == "replace":
            sections.append(Section(s.title, edit.content.strip()))
        elif edit.op == "append":
            sections.append(Section(s.title, (s.body + "\n" + edit.content.strip()).strip()))
        # delete: dropped; sections inserted after it still take its place
        for new in inserts_after.get(i, []):
            sections.append(Section(new.section.strip(), new.content.strip()))
    for new in inserts_after.get(None, []):
        sections.append(Section(new.section.strip(), new.content.strip()))
    out.sections = sections
    return out


# ------------------------------------------------------------------------------------------ merge
def _line_key(line: str) -> str:
    return " ".join(line.strip().lstrip("-*• ").lower().split())


def _unite(*contents: str) -> str:
    """The lines of every content, in order, each (by _line_key) once; blank lines dropped."""
    seen: set[str] = set()
    out = []
    for content in contents:
        for line in content.strip().split("\n"):
            key = _line_key(line)
            if key and key not in seen:
                seen.add(key)
                out.append(line.rstrip())
    return "\n".join(out)


def _short(text: str, n: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def merge(patches: list[Patch], source: str | None = None) -> tuple[Patch, list[Conflict]]:
    """One patch equivalent to `patches` (all against the same base) under the rules in the module
    docstring, and the conflicts it resolved."""
    slots: dict[str, list[tuple[int, Edit]]] = {}
    order = 0
    for patch in patches:
        for edit in patch.edits:
            slots.setdefault(edit.key, []).append((order, edit))
            order += 1
    merged: list[Edit] = []
    conflicts: list[Conflict] = []
    for key, entries in slots.items():  # dicts keep first-appearance order
        edits = [e for _, e in entries]
        title = edits[0].section
        inserts = [e for e in edits if e.op == "insert"]
        if inserts:
            if len(inserts) != len(edits):
                raise SkillError(f"section {title!r} is both inserted and edited: the patches have different bases")
            merged.append(Edit("insert", inserts[0].section, _unite(*(e.content for e in inserts)), inserts[0].after,
                               sum(e.support for e in inserts)))
            continue
        deletes = sum(e.support for e in edits if e.op == "delete")
        replaces = [(o, e) for o, e in entries if e.op == "replace"]
        appends = [e for e in edits if e.op == "append"]
        keep = sum(e.support for _, e in replaces) + sum(e.support for e in appends)
        if deletes and keep:
            delete_wins = deletes > keep
            conflicts.append(Conflict(
                title, "delete-vs-edit", "delete" if delete_wins else "edit",
                ["edit"] if delete_wins else ["delete"], {"delete": deletes, "edit": keep},
            ))
            if delete_wins:
                merged.append(Edit("delete", title, support=deletes))
                continue
        elif deletes:
            merged.append(Edit("delete", title, support=deletes))
            continue
        appended = _unite(*(e.content for e in appends)) if appends else ""
        if replaces:
            votes: dict[str, list] = {}  # normalised content -> [support, last order, content]
            for o, e in replaces:
                norm = _unite(e.content).lower()
                slot = votes.setdefault(norm, [0, -1, e.content])
                slot[0] += e.support
                if o > slot[1]:
                    slot[1], slot[2] = o, e.content
            ranked = sorted(votes.values(), key=lambda v: (v[0], v[1]), reverse=True)
            winner = ranked[0][2]
            if len(ranked) > 1:
                conflicts.append(Conflict(
                    title, "replace-vs-replace", _short(winner), [_short(v[2]) for v in ranked[1:]],
                    {_short(v[2]): v[0] for v in ranked},
                ))
            content = _unite(winner, appended) if appended else winner.strip()
            merged.append(Edit("replace", title, content, support=keep))
        else:
            merged.append(Edit("append", title, appended, support=keep))
    name = source if source is not None else "merge(" + ",".join(p.source or "?" for p in patches) + ")"
    return Patch(merged, name), conflicts


def hierarchical_merge(patches: list[Patch], group_size: int = 4) -> tuple[Patch, list[Conflict], int]:
    """Merge `patches` in consecutive groups of `group_size`, then the merged patches likewise,
    until one is left. Returns (the patch, every conflict on the way, the number of levels)."""
    if group_size < 2:
        raise ValueError(f"group_size must be >= 2, got {group_size}")
    level = [p for p in patches if p.edits]
    conflicts: list[Conflict] = []
    levels = 0
    if not level:
        return Patch([], "merge()"), conflicts, 0
    while len(level) > 1 or levels == 0:
        levels += 1
        nxt = []
        for g in range(0, len(level), group_size):
            patch, found = merge(level[g : g + group_size], source=f"L{levels}.{g // group_size}")
            conflicts.extend(found)
            nxt.append(patch)
        level = nxt
    return level[0], conflicts, levels
