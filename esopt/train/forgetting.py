"""What a fine-tuning run cost outside the trained env: a forgetting probe measured before and after.

Two numbers, both cheap enough for every run:
- `general_loglik`: mean per-token log-likelihood, under the model, of the reference answers of a fixed
  set of generic instruction/answer pairs (bundled below, written for esopt). Fine-tuning that damages
  general language ability lowers it; a gain on the trained env with a large drop here is overfitting.
- `other_env_success`: greedy success on a fixed set of validation tasks of a different env than the
  trained one (Sudoku runs are probed on Countdown, every other env on Sudoku).
"""

from __future__ import annotations

import dataclasses

import torch

from esopt.policy.base import SamplingConfig
from esopt.rollout import RolloutConfig, rollout

GENERAL_PAIRS: tuple[tuple[str, str], ...] = (
    ("What is the capital of France?", "The capital of France is Paris."),
    ("How many days are there in a week?", "There are seven days in a week."),
    ("Name the largest planet in our solar system.", "Jupiter is the largest planet in our solar system."),
    ("What is 12 plus 30?", "12 plus 30 is 42."),
    ("Translate 'thank you' into Spanish.", "'Thank you' in Spanish is 'gracias'."),
    ("What do bees make?", "Bees make honey and beeswax."),
    ("Give a synonym for 'happy'.", "A synonym for 'happy' is 'joyful'."),
    ("What is the boiling point of water at sea level in Celsius?", "Water boils at 100 degrees Celsius at sea level."),
    ("Write a short greeting for a new colleague.", "Welcome to the team! We are glad to have you here."),
    ("Which ocean is the largest?", "The Pacific Ocean is the largest ocean on Earth."),
    ("What is the opposite of 'cold'?", "The opposite of 'cold' is 'hot'."),
    ("How many legs does a spider have?", "A spider has eight legs."),
    ("Who wrote 'Romeo and Juliet'?", "William Shakespeare wrote 'Romeo and Juliet'."),
    ("What gas do plants take in from the air?", "Plants take in carbon dioxide from the air."),
    ("Summarize in one sentence: The meeting moved from Monday to Wednesday because the room was booked.",
     "The meeting was moved to Wednesday because the room was unavailable on Monday."),
    ("What is the square root of 81?", "The square root of 81 is 9."),
    ("List three primary colors.", "Red, blue and yellow are the three primary colors."),
    ("What is the freezing point of water in Fahrenheit?", "Water freezes at 32 degrees Fahrenheit."),
    ("Which animal is known as the king of the jungle?", "The lion is known as the king of the jungle."),
    ("What language is mostly spoken in Brazil?", "Portuguese is the main language spoken in Brazil."),
    ("Correct the sentence: 'She go to school every day.'", "She goes to school every day."),
    ("How many minutes are in an hour?", "There are sixty minutes in an hour."),
    ("What is the chemical symbol for gold?", "The chemical symbol for gold is Au."),
    ("Suggest a name for a small bakery.", "A nice name for a small bakery is 'The Morning Loaf'."),
    ("What is 7 times 8?", "7 times 8 is 56."),
    ("Which continent is Egypt in?", "Egypt is in Africa."),
    ("Explain what a noun is.", "A noun is a word that names a person, place, thing or idea."),
    ("What is the tallest mountain in the world?", "Mount Everest is the tallest mountain in the world."),
    ("How many sides does a triangle have?", "A triangle has three sides."),
    ("What does a thermometer measure?", "A thermometer measures temperature."),
    ("Give one tip for sleeping well.", "Keep a regular bedtime and avoid screens before sleep."),
    ("What is the main ingredient of guacamole?", "The main ingredient of guacamole is avocado."),
)


def general_loglik(policy, pairs: tuple[tuple[str, str], ...] = GENERAL_PAIRS) -> float | None:
    """Mean per-token log-likelihood of each answer given its instruction (chat template, no system
    prompt); None for a policy without a local transformers model (e.g. the vLLM backend)."""
    model, tokenizer = getattr(policy, "model", None), getattr(policy, "tokenizer", None)
    if model is None or tokenizer is None or not hasattr(tokenizer, "apply_chat_template"):
        return None
    total, count = 0.0, 0
    device = next(model.parameters()).device
    with torch.no_grad():
        for question, answer in pairs:
            prompt = tokenizer.apply_chat_template(
                [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
            )
            prompt_ids = tokenizer(prompt, add_special_tokens=False).input_ids
            answer_ids = tokenizer(answer, add_special_tokens=False).input_ids
            ids = torch.tensor([prompt_ids + answer_ids], device=device)
            logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
            logprobs = torch.log_softmax(logits, dim=-1)
            total += logprobs.gather(1, ids[0, len(prompt_ids) :, None]).sum().item()
            count += len(answer_ids)
    return total / count


def other_env_spec(trained_env: str) -> tuple[str, dict]:
    """The env a run is probed on (name, options): one the run did not train on, in a small fixed setting."""
    if trained_env == "sudoku":
        return "countdown", {"min_numbers": 3, "max_numbers": 3, "max_value": 20, "min_target": 5, "max_target": 40,
                             "multi_turn": False}
    return "sudoku", {"size": 4, "empty_cells": 1, "grammar": "legal"}


def probe(policy, trained_env: str, rollout_config: RolloutConfig, tasks: int = 32) -> dict[str, float]:
    """The forgetting probe's metrics (keys `probe/...`) for the policy's current weights."""
    out: dict[str, float] = {}
    loglik = general_loglik(policy)
    if loglik is not None:
        out["probe/general_loglik"] = loglik
    from esopt.envs import make_env

    env = make_env(*other_env_spec(trained_env))
    # Its own decoding, not the run's: a run's forced reply length (min_new_tokens) or stop strings would
    # change what the probe measures (and vLLM refuses min_new_tokens above the probe's 24).
    greedy = dataclasses.replace(
        rollout_config.real_episodes(), sampling=SamplingConfig(temperature=0.0, max_new_tokens=24), history_turns=-1
    )
    result = rollout(policy, env, env.tasks("val", tasks, 0), greedy, seed=0)
    out["probe/other_env_success"] = result.metrics["success"]
    return out


def log_probe(metrics, policy, config, step: int) -> None:
    """Log the probe at `step` to a run's MetricsLogger, unless the run config turns it off (probe_tasks 0)."""
    if config.probe_tasks:
        metrics.log(step, probe(policy, config.env.name, config.rollout, config.probe_tasks))
