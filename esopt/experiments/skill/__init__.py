"""Trace2Skill conditions: a skill document distilled from trajectories, placed in context, alone
and together with Agentic ESOpt. One experiment directory holds one subdirectory per condition:

- `baseline`        No Skill: the base model, evaluated as is.
- `trace2skill`     Trace2Skill: `iterations` rounds of (roll out `trace_tasks` train tasks with the
                    frozen model and the current skill -> distil a new skill), then evaluation with it.
- `es`              Agentic ESOpt + No Skill: an ES run (the ordinary trainer), evaluated without a skill.
- `es+trace2skill`  Agentic ESOpt + Trace2Skill: distil once from every saved training trajectory of
                    the `es` run, then evaluate the ES model with that skill.
- `coevolve`        Co-evolution: ES with the skill in context; every `skill_every` ES steps the skill
                    is distilled again from the trajectories of those steps; evaluated with the final skill.

Every condition is evaluated the same way: the same held-out tasks (eval_tasks, eval_seed), k =
`samples` episodes per task at `eval_temperature`, scored by esopt.train.evaluate (Mean@k of the
reward, Pass@k of success). Each condition directory holds `result.json`, `eval_trajectories.jsonl`
and, where a skill is used, `SKILL.md`, `skill_v<N>.md` and `distill_log.jsonl`; `report.md` in
the experiment directory puts the conditions side by side.

    esopt skill run --config configs/skill_math.yaml            # every condition, then the report
    esopt skill trace2skill --config configs/skill_math.yaml    # one condition
    esopt skill report runs/skill_math__0

Modules: `conditions.py` runs them (read it first), `config.py` holds the settings, `report.py` the
side-by-side table, `cli.py` the `esopt skill` commands.
"""
