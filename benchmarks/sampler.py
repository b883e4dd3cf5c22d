"""Sampled decoding: transformers' multinomial sampler vs esopt's inverse-CDF sampler, side by side.

    python -m benchmarks.sampler [--batch 64] [--new-tokens 32] [--repeats 2]

Both decode the same B chat prompts (Sudoku observations) with the default model at temperature 1,
top_p 1, no grammar; the HF path is model.generate(do_sample=True) (torch.multinomial each step), the
esopt path is the same call in greedy mode with esopt.policy.sampling's processors (softmax -> cumsum
-> searchsorted); both generate exactly --new-tokens tokens. Reports
the median seconds of each and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import LogitsProcessorList

from esopt.envs import make_env
from esopt.policy.base import SamplingConfig
from esopt.policy.config import ModelConfig
from esopt.policy.hf import HFPolicy
from esopt.policy.sampling import sampling_processors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    policy = HFPolicy.load(ModelConfig(dtype="bfloat16", attn_implementation="sdpa"))
    env = make_env("sudoku", {"size": 4, "empty_cells": 2})
    chats = [
        [{"role": "system", "content": env.system_prompt}, {"role": "user", "content": env.start(task).observation}]
        for task in env.tasks("eval", args.batch, 0)
    ]
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=args.new_tokens)
    tok = policy.tokenizer
    texts = tok.apply_chat_template(chats, add_generation_prompt=True, tokenize=False)
    encoded = tok(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)

    common = dict(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, pad_token_id=tok.pad_token_id)

    def hf_multinomial():
        torch.manual_seed(0)
        with torch.inference_mode():
            policy.model.generate(**encoded, do_sample=True, temperature=1.0, top_p=1.0, top_k=None, **common)

    def esopt_inverse_cdf():
        torch.manual_seed(0)
        with torch.inference_mode():
            policy.model.generate(**encoded, do_sample=False, logits_processor=LogitsProcessorList(sampling_processors(sampling)), **common)

    times = {"hf_multinomial": [], "esopt_inverse_cdf": []}
    esopt_inverse_cdf()  # warm-up
    for _ in range(args.repeats):
        for name, fn in (("hf_multinomial", hf_multinomial), ("esopt_inverse_cdf", esopt_inverse_cdf)):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    hf, ours = (statistics.median(times[k]) for k in times)
    print(f"B={args.batch}, exactly {args.new_tokens} new tokens, the same model.generate call but for the sampler")
    print(f"HF multinomial sampling: {hf:.2f} s   esopt inverse-CDF sampling: {ours:.2f} s   ratio {hf / ours:.2f}")


if __name__ == "__main__":
    main()
