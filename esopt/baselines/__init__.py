"""Gradient baselines ES is compared against: multi-turn GRPO and PPO on the same rollout engine.
Read `trainer.py` first (the shared policy-gradient loop); `grpo.py` and `ppo.py` add their advantages,
`config.py` the settings, `samples.py` the sampled tokens and loss masks, `losses.py` advantages and
token log-probs, `report.py` the run report."""
