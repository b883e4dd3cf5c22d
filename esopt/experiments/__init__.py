"""Experiments built around the trainers: `compare.py` (ES vs GRPO vs PPO at matched budgets) and
`skill/` (the Trace2Skill conditions: skill documents in context, with and without ES)."""
