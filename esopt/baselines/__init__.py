"""Gradient baselines ES is compared against: multi-turn GRPO and PPO on the same rollout engine.
Read `pg_common.py` first (the shared policy-gradient trainer); `grpo.py` and `ppo.py` add advantages."""
