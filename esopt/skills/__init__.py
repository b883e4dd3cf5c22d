"""Trace2Skill: skill documents distilled from trajectories and placed in the agent's context.

- `document`: the Skill (markdown `## ` sections, version, content hash, limits),
- `patch`: insert/append/replace/delete edits against a frozen snapshot, apply, hierarchical merge,
- `analyst`: who proposes patches (the policy, another local model, an OpenAI-compatible endpoint,
  or a script), and the strict reply format,
- `distill`: one round: trajectories -> proposals -> merge -> validate -> a new version on disk.
"""

from esopt.skills.document import Section, Skill, SkillError, SkillLimits, load_cached, seed_skill
from esopt.skills.patch import OPS, Conflict, Edit, Patch, apply_patch, hierarchical_merge, merge

__all__ = [
    "OPS", "Conflict", "Edit", "Patch", "Section", "Skill", "SkillError", "SkillLimits", "apply_patch",
    "hierarchical_merge", "load_cached", "merge", "seed_skill",
]
