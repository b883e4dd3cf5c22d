"""The whole ES loop on a reward of your own, in esopt's public API: no env, no trainer, no CLI.

The reward here asks for one-word answers; replace `reward` with any function of the reply. Each step
draws G perturbations of every weight (ask), scores each perturbed model on the same prompts, and moves
the weights along the fitness-weighted sum of the perturbations (tell + apply). The update is a
plain record: write it to history.jsonl and `esopt.es.replay` rebuilds these weights bit-exactly.

    python examples/minimal_es.py                      # SmolLM2-135M-Instruct, about a minute on a CPU
    python examples/minimal_es.py --model DIR --steps 3    # any local Hugging Face model directory
"""

from __future__ import annotations

import argparse
import statistics

from esopt.es import ESConfig, make_strategy
from esopt.policy import SamplingConfig, load_policy
from esopt.policy.config import ModelConfig

PROMPTS = [
    "What colour is the sky on a clear day?",
    "Which animal says moo?",
    "What is the opposite of hot?",
    "Which planet do we live on?",
]


def reward(reply: str) -> float:
    """1 for a one-word answer, less the more words it has, 0 for no answer."""
    words = reply.split()
    return 1.0 / len(words) if words else 0.0


def main(argv: list[str] | None = None) -> list[float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default", help="'default' (SmolLM2-135M-Instruct) or a model directory")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--population", type=int, default=8)
    parser.add_argument("--sigma", type=float, default=1e-3, help="perturbation size (cosine-decayed to half)")
    parser.add_argument("--alpha", type=float, default=5e-4, help="step size (1/sigma folded in)")
    args = parser.parse_args(argv)

    policy = load_policy(ModelConfig(path=args.model))
    config = ESConfig(population=args.population, sigma=args.sigma, sigma_final=args.sigma / 2, alpha=args.alpha)
    strategy = make_strategy(config, total_steps=args.steps, run_seed=0)
    strategy.prepare(policy.master_weights())  # checks the noise and scope fit this model
    chats = [[{"role": "user", "content": prompt}] for prompt in PROMPTS]
    sampling = SamplingConfig(max_new_tokens=12)  # greedy: a member's score depends only on its weights
    print(f"base model {policy.fingerprint()}")

    means = []
    for step in range(args.steps):
        members = strategy.ask(step)
        fitness = []
        for member in members:
            with policy.perturbed(member):  # theta + sigma * eps_i inside, restored exactly on exit
                replies = policy.generate(chats, sampling)
            fitness.append(statistics.mean(reward(r) for r in replies))
        update = strategy.tell(step, members, fitness)  # shaped fitness -> one update record
        policy.apply(update)
        means.append(statistics.mean(fitness))
        print(f"step {step}: mean fitness {means[-1]:.3f}, best {max(fitness):.3f}, sigma {update.sigma:.2e}")

    replies = policy.generate(chats, sampling)
    print(f"trained model {policy.fingerprint()}; its replies:")
    for prompt, reply in zip(PROMPTS, replies):
        print(f"  {prompt} -> {reply!r}")
    return means


if __name__ == "__main__":
    main()
