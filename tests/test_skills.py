"""Trace2Skill: skill documents, patches, hierarchical merge, analyst parsing, distillation and skill
injection in rollouts (the experiment's conditions: test_skill_conditions.py)."""

import json

import pytest

from esopt.confutil import ConfigError
from esopt.envs import make_env
from esopt.rollout import RolloutConfig, rollout
from esopt.skills import Edit, Patch, Skill, SkillError, SkillLimits, apply_patch, hierarchical_merge, merge
from esopt.skills.analyst import Rejection, ScriptedAnalyst, parse_reply, reply_regex
from esopt.skills.distill import DistillConfig, distill, read_log

BASE = """<!-- esopt-skill v2 -->
# Skill: demo
Read this first.

## Format
- Reply with one action.

## Mistakes
- Do not guess.

## Checks
- Verify the result.
"""


def base() -> Skill:
    return Skill.parse(BASE)


# ------------------------------------------------------------------------------------------ document
def test_parse_render_roundtrip_version_and_hash():
    skill = base()
    assert skill.version == 2 and skill.title == "Skill: demo" and skill.preamble == "Read this first."
    assert skill.titles() == ["Format", "Mistakes", "Checks"]
    assert skill.render(header=True) == BASE
    assert Skill.parse(skill.render(header=True)) == skill
    assert "esopt-skill" not in skill.text  # the agent never sees the header
    assert skill.tag == f"v2-{skill.content_hash}" and len(skill.content_hash) == 8
    assert skill.find("  mistakes ") == 1  # titles match case- and whitespace-insensitively


def test_validation_names_the_broken_limit():
    skill = base()
    skill.validate(SkillLimits())
    with pytest.raises(SkillError, match="more than the limit of 50"):
        skill.validate(SkillLimits(max_chars=50))
    with pytest.raises(SkillError, match="3 sections, more than the limit of 2"):
        skill.validate(SkillLimits(max_sections=2))
    dup = Skill.parse("## A\nx\n\n## a\ny\n")
    with pytest.raises(SkillError, match="appears twice"):
        dup.validate()
    with pytest.raises(ConfigError, match="max_chars"):
        SkillLimits(max_chars=0).validate()


# -------------------------------------------------------------------------------------------- patches
@pytest.mark.parametrize(
    "edit, expected_sections",
    [
        (Edit("insert", "Tools", "- Use the calculator.", after="Format"),
         [("Format", "- Reply with one action."), ("Tools", "- Use the calculator."), ("Mistakes", "- Do not guess."),
          ("Checks", "- Verify the result.")]),
        (Edit("insert", "Tools", "- Use the calculator."),
         [("Format", "- Reply with one action."), ("Mistakes", "- Do not guess."), ("Checks", "- Verify the result."),
          ("Tools", "- Use the calculator.")]),
        (Edit("append", "mistakes", "- Do not repeat an action."),
         [("Format", "- Reply with one action."), ("Mistakes", "- Do not guess.\n- Do not repeat an action."),
          ("Checks", "- Verify the result.")]),
        (Edit("replace", "Checks", "- Recompute once."),
         [("Format", "- Reply with one action."), ("Mistakes", "- Do not guess."), ("Checks", "- Recompute once.")]),
        (Edit("delete", "Format"), [("Mistakes", "- Do not guess."), ("Checks", "- Verify the result.")]),
    ],
)
def test_each_op_applies(edit, expected_sections):
    skill = base()
    new = apply_patch(skill, Patch([edit]))
    assert [(s.title, s.body) for s in new.sections] == expected_sections
    assert skill.render(header=True) == BASE  # the base is never modified
    assert new.version == skill.version  # versioning is the caller's job


def test_insert_after_a_deleted_section_takes_its_place():
    new = apply_patch(base(), Patch([Edit("delete", "Mistakes"), Edit("insert", "Pitfalls", "- x", after="Mistakes")]))
    assert new.titles() == ["Format", "Pitfalls", "Checks"]


@pytest.mark.parametrize(
    "edit, reason",
    [
        (Edit("append", "Nope", "- x"), "no section 'Nope'"),
        (Edit("insert", "FORMAT", "- x"), "already exists"),
        (Edit("replace", "Checks", ""), "empty content"),
        (Edit("append", "Checks", "## New\n- x"), "headings"),
        (Edit("rename", "Checks", "x"), "unknown op"),
        (Edit("insert", "New", "- x", after="Nope"), "no section 'Nope' to insert after"),
    ],
)
def test_bad_edits_raise_with_reason(edit, reason):
    with pytest.raises(SkillError, match=reason):
        apply_patch(base(), Patch([edit]))


def _doc(skill: Skill) -> str:
    return skill.render()


def test_merge_of_hand_written_patches_with_conflicts():
    patches = [
        Patch([Edit("append", "Mistakes", "- Do not repeat an action."), Edit("replace", "Checks", "- Recompute once.")], "t1"),
        Patch([Edit("append", "Mistakes", "- do not repeat an action.\n- Read the numbers twice.")], "t2"),
        Patch([Edit("replace", "Checks", "- Check every number is used."), Edit("delete", "Format")], "t3"),
        Patch([Edit("replace", "Checks", "- Check every number is used.")], "t4"),
        Patch([Edit("delete", "Mistakes"), Edit("insert", "Tools", "- Use the calculator.", after="Format")], "t5"),
        Patch([Edit("insert", "Tools", "- Use the calculator.\n- One call per turn.")], "t6"),
    ]
    merged, conflicts = merge(patches)
    # appends united (duplicate line kept once); replace-vs-replace: 2 votes beat 1; delete (1) loses to
    # two appends on Mistakes; delete of Format is uncontested; the two inserts are united.
    expected = """# Skill: demo
Read this first.

## Tools
- Use the calculator.
- One call per turn.

## Mistakes
- Do not guess.
- Do not repeat an action.
- Read the numbers twice.

## Checks
- Check every number is used.
"""
    assert _doc(apply_patch(base(), merged)) == expected
    kinds = {(c.section, c.kind, c.winner) for c in conflicts}
    assert kinds == {("Checks", "replace-vs-replace", "- Check every number is used."), ("Mistakes", "delete-vs-edit", "edit")}
    votes = next(c.votes for c in conflicts if c.kind == "delete-vs-edit")
    assert votes == {"delete": 1, "edit": 2}


def test_conflict_rules_ties_and_majorities():
    # replace vs replace, one vote each: the later patch wins
    merged, conflicts = merge([Patch([Edit("replace", "Checks", "- A")]), Patch([Edit("replace", "Checks", "- B")])])
    assert apply_patch(base(), merged).section("Checks").body == "- B"
    assert conflicts[0].kind == "replace-vs-replace" and conflicts[0].losers == ["- A"]
    # delete vs replace, tie: the section is kept (replaced)
    merged, conflicts = merge([Patch([Edit("delete", "Checks")]), Patch([Edit("replace", "Checks", "- B")])])
    assert apply_patch(base(), merged).section("Checks").body == "- B"
    assert conflicts[0].winner == "edit"
    # delete with more support than the edits: deleted
    merged, _ = merge([Patch([Edit("delete", "Checks")]), Patch([Edit("replace", "Checks", "- B")]), Patch([Edit("delete", "Checks")])])
    assert apply_patch(base(), merged).section("Checks") is None
    # replace + append: the replacement, then the appended line
    merged, conflicts = merge([Patch([Edit("append", "Checks", "- Also this.")]), Patch([Edit("replace", "Checks", "- B")])])
    assert apply_patch(base(), merged).section("Checks").body == "- B\n- Also this." and not conflicts


def test_hierarchical_merge_carries_votes_across_levels():
    a = [Patch([Edit("replace", "Checks", "- A")], f"a{i}") for i in range(3)]
    b = [Patch([Edit("replace", "Checks", "- B")], f"b{i}") for i in range(2)]
    d = [Patch([Edit("delete", "Format")], "d"), Patch([Edit("append", "Format", "- keep")], "k1"),
         Patch([Edit("append", "Format", "- keep too")], "k2")]
    patches = [b[0], a[0], b[1], a[1], d[0], a[2], d[1], d[2], Patch([], "empty")]
    merged, conflicts, levels = hierarchical_merge(patches, group_size=2)
    assert levels == 3  # 8 non-empty patches: 8 -> 4 -> 2 -> 1
    doc = apply_patch(base(), merged)
    assert doc.section("Checks").body == "- A"  # 3 votes beat 2, although B came first in some groups
    assert doc.section("Format").body == "- Reply with one action.\n- keep\n- keep too"  # 2 keep votes beat 1 delete
    assert any(c.kind == "delete-vs-edit" for c in conflicts)
    flat, _ = merge(patches)
    assert _doc(apply_patch(base(), flat)) == _doc(doc)
    assert hierarchical_merge(patches, 2)[0].to_json() == merged.to_json()  # deterministic


# ------------------------------------------------------------------------------------------- analyst
@pytest.mark.parametrize(
    "reply, reason",
    [
        ("I think the agent should check its work.", "not JSON"),
        ('Sure! {"op": "append", "section": "Checks", "content": "- x"}', "text outside the JSON"),
        ('{"op": "rename", "section": "Checks"}', "op must be one of"),
        ('{"op": "append", "section": "Checks", "content": "- x", "why": "y"}', "unknown field"),
        ('{"op": "append", "section": "Nowhere", "content": "- x"}', "no section 'Nowhere'"),
        ('{"op": "insert", "section": "Checks", "content": "- x"}', "already exists"),
        ('{"op": "append", "section": "Checks", "content": ""}', "empty content"),
        ('{"op": "append", "section": "Checks", "content": "' + "x" * 700 + '"}', "more than the limit"),
        ('[{"op": "append", "section": "Checks", "content": "- x"}, {"op": "delete", "section": "checks"}]', "edited twice"),
        ("", "empty reply"),
        ("42", "expected a JSON object"),
    ],
)
def test_malformed_replies_are_rejected_with_a_reason(reply, reason):
    result = parse_reply(reply, base(), source="t")
    assert isinstance(result, Rejection) and reason in result.reason and result.raw == reply


def test_well_formed_replies_parse():
    skill = base()
    p = parse_reply('```json\n{"op": "append", "section": "checks", "content": ["- a", "- b"], "reason": "r"}\n```', skill)
    assert isinstance(p, Patch) and p.edits == [Edit("append", "checks", "- a\n- b")]
    p = parse_reply('{"edits": [{"op": "delete", "section": "Format"}, {"op": "insert", "section": "New", "content": "- n", "after": "Checks"}]}', skill)
    assert [e.op for e in p.edits] == ["delete", "insert"] and p.edits[1].after == "Checks"
    assert parse_reply('{"op": "none"}', skill) == Patch([], "")


def test_reply_regex_accepts_what_the_parser_accepts():
    import re

    skill = base()
    regex = reply_regex(skill)
    good = '{"op": "append", "section": "Mistakes", "content": "- Check the sum."}'
    assert re.fullmatch(regex, good) and isinstance(parse_reply(good, skill), Patch)
    assert re.fullmatch(regex, '{"op": "delete", "section": "Checks"}')
    assert re.fullmatch(regex, '{"op": "insert", "section": "New tips", "content": "- x y z"}')
    assert not re.fullmatch(regex, '{"op": "append", "section": "Nowhere", "content": "- x"}')


# -------------------------------------------------------------------------------------------- distill
def _trajectories(n: int) -> list[dict]:
    return [{"task_id": f"t{i}", "success": i % 2 == 0, "reward": float(i % 2 == 0),
             "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": f"task {i}"},
                          {"role": "assistant", "content": f"answer: {i}"}], "feedback": ["ok"], "done": True}
            for i in range(n)]


def test_distill_with_a_scripted_analyst(tmp_path):
    def reply(skill, trajectory):
        i = int(trajectory["task_id"][1:])
        if i == 3:
            return "garbage"
        section = "Checks" if trajectory["success"] else "Mistakes"
        return json.dumps({"op": "append", "section": section, "content": f"- lesson {i % 4}"})

    result = distill(base(), _trajectories(6), ScriptedAnalyst(reply), DistillConfig(group_size=2), tmp_path, round_name="r0")
    assert result.valid == 5 and len(result.rejections) == 1 and result.rejections[0].source == "t3"
    assert result.skill.version == 3 and result.changed
    assert result.skill.section("Checks").body == "- Verify the result.\n- lesson 0\n- lesson 2"
    assert result.skill.section("Mistakes").body == "- Do not guess.\n- lesson 1"  # t5 repeats lesson 1
    assert Skill.load(tmp_path / "SKILL.md") == result.skill
    assert Skill.load(tmp_path / "skill_v2.md") == base() and Skill.load(tmp_path / "skill_v3.md") == result.skill
    log = read_log(tmp_path)
    assert [r["kind"] for r in log] == ["proposal"] * 6 + ["merge", "result"]
    bad = [r for r in log if r["kind"] == "proposal" and not r["valid"]]
    assert len(bad) == 1 and bad[0]["source"] == "t3" and "not JSON" in bad[0]["reason"] and bad[0]["raw"] == "garbage"
    assert log[-1]["valid_rate"] == pytest.approx(5 / 6) and log[-1]["tag"] == result.skill.tag
    again = distill(base(), _trajectories(6), ScriptedAnalyst(reply), DistillConfig(group_size=2))
    assert again.skill == result.skill  # deterministic


def test_malformed_analyst_output_leaves_the_skill_unchanged(tmp_path):
    skill = base()
    analyst = ScriptedAnalyst(["not json", '{"op": "append", "section": "Nowhere", "content": "- x"}'])
    result = distill(skill, _trajectories(4), analyst, out_dir=tmp_path)
    assert not result.changed and result.skill == skill and result.skill.version == 2
    assert {r.reason.split(" (")[0] for r in result.rejections} == {"not JSON", "append: no section 'Nowhere' in the skill"}
    assert Skill.load(tmp_path / "SKILL.md") == skill and not (tmp_path / "skill_v3.md").exists()
    assert read_log(tmp_path)[-1]["changed"] is False


def test_over_limit_merge_drops_the_weakest_additions(tmp_path):
    limits = SkillLimits(max_chars=len(base().text) + 40)
    replies = ['{"op": "append", "section": "Checks", "content": "- short"}'] * 2 + [
        '{"op": "insert", "section": "Long", "content": "- ' + "y" * 60 + '"}']
    result = distill(base(), _trajectories(3), ScriptedAnalyst(replies), DistillConfig(limits=limits))
    assert [e.section for e in result.dropped] == ["Long"]
    assert result.skill.section("Checks").body.endswith("- short") and result.skill.section("Long") is None


# ----------------------------------------------------------------------------------- skill injection
class EchoPolicy:
    """Replies with a fixed sudoku move and records the chats."""

    def __init__(self):
        self.chats = []

    def generate(self, chats, sampling, action_regex=None, seed=0):
        self.chats += chats
        return ["set 1 1 1"] * len(chats)


def test_skill_goes_into_the_system_prompt_and_its_version_is_recorded(tmp_path):
    env = make_env("sudoku", {"size": 4, "empty_cells": 1})
    tasks = env.tasks("train", 2, 0)
    path = base().save(tmp_path / "SKILL.md")
    policy = EchoPolicy()
    result = rollout(policy, env, tasks, RolloutConfig(skill=str(path)))
    system = result.trajectories[0].messages[0]["content"]
    assert system.startswith(env.system_prompt) and "## Mistakes\n- Do not guess." in system and "esopt-skill" not in system
    assert {t.skill_version for t in result.trajectories} == {base().tag}
    assert result.trajectories[0].to_json()["skill_version"] == base().tag
    # a rewritten file is re-read (co-evolution updates it between steps)
    apply_patch(base(), Patch([Edit("append", "Checks", "- new")])).copy(version=3).save(path)
    again = rollout(policy, env, tasks, RolloutConfig(skill=str(path)))
    assert again.trajectories[0].skill_version.startswith("v3-") and "- new" in again.trajectories[0].messages[0]["content"]
    plain = rollout(policy, env, tasks, RolloutConfig())
    assert plain.trajectories[0].skill_version == "" and plain.trajectories[0].messages[0]["content"] == env.system_prompt
    with pytest.raises(ConfigError, match="rollout.skill: skill document not found"):
        rollout(policy, env, tasks, RolloutConfig(skill=str(tmp_path / "missing.md")))


def test_policy_analyst_guided_reply_is_parseable(make_tiny_policy):
    import re

    from esopt.policy.base import SamplingConfig
    from esopt.skills.analyst import PolicyAnalyst

    skill = base()
    analyst = PolicyAnalyst(make_tiny_policy(), SamplingConfig(temperature=0.0, max_new_tokens=48), guided=True)
    [proposal] = analyst.propose_many(skill, _trajectories(1))
    [reply] = analyst.replies()
    if re.fullmatch(reply_regex(skill), reply):  # a complete reply within the grammar always parses
        assert isinstance(proposal, Patch) or "already exists" in proposal.reason
    else:  # cut off by max_new_tokens: rejected, never an exception
        assert isinstance(proposal, Rejection) and reply.startswith('{"op": "')


def test_openai_analyst_parses_replies_and_records_failures(monkeypatch):
    from esopt.skills.analyst import AnalystConfig, OpenAIAnalyst, make_analyst

    analyst = make_analyst(AnalystConfig(kind="openai", model_name="m"))
    assert isinstance(analyst, OpenAIAnalyst)
    replies = iter(['{"op": "delete", "section": "Checks"}', ConnectionError("refused")])

    def complete(messages, seed):
        assert messages[0]["role"] == "system" and "EPISODE (SUCCESS" in messages[1]["content"]
        reply = next(replies)
        if isinstance(reply, Exception):
            raise reply
        return reply

    monkeypatch.setattr(analyst, "_complete", complete)
    ok, failed = analyst.propose_many(base(), [_trajectories(1)[0]] * 2)
    assert ok.edits == [Edit("delete", "Checks")]
    assert isinstance(failed, Rejection) and failed.reason == "request failed: ConnectionError: refused"
    with pytest.raises(ConfigError, match="model_name"):
        make_analyst(AnalystConfig(kind="openai"))
    with pytest.raises(ConfigError, match="analyst.kind"):
        AnalystConfig(kind="gpt").validate()
