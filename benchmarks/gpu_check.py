"""GPU readiness check: a randomly initialised model of a real shape, ES vs inference vs GRPO on CUDA.

    python -m benchmarks.gpu_check [--shape 0.5b|1.5b|tiny] [--device cuda|cpu] [--population 8] [--tasks 8]
                                   [--new-tokens 64] [--out gpu_check_results]

Builds the model from a config (no download: random weights, the default model's tokenizer), saves it
to a temporary directory, and runs `make bench`'s runs on it (benchmarks/bench.py, each in its own child
process): inference on the G*N episodes in one batch, one ES step with low-rank noise (population-
batched) and with full-rank noise (members one after another), and one GRPO step on the same G*N
episodes. The workload is 4x4 Sudoku prompts answered with exactly --new-tokens tokens (greedy, end-of-
sequence suppressed until then; no grammar), so every run generates the same number of tokens whatever
random weights say. Writes bench.md / bench.json (tokens/s, ratios, peak RSS and peak GPU memory) to
--out. benchmarks/gpu_check.sh runs this after the policy and ES unit tests, on CUDA.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import yaml

SHAPES = {
    # Block shapes of public models (vocabulary: the default model's tokenizer, 49152 tokens).
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2),
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2),
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2),
}
RUNS = "inference-batched,es-lowrank,es-full,grpo"


def build_model(shape: str, directory: Path) -> int:
    """Save a randomly initialised Llama of `shape` (bf16) with the default model's tokenizer; returns its parameter count."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from esopt.policy.models import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("default"))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **SHAPES[shape],
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return sum(p.numel() for p in model.parameters())


def workload(model_dir: Path, device: str, new_tokens: int) -> dict:
    """A run config for benchmarks.bench: fixed-length greedy replies to Sudoku prompts on `device`."""
    return {
        "model": {"path": str(model_dir), "dtype": "bfloat16", "attn_implementation": "sdpa", "device": device},
        "env": {"name": "sudoku", "options": {"size": 4, "empty_cells": 1, "max_turns": 1}},
        "es": {"strategy": "agentic-esopt", "sigma": 1.0e-2, "sigma_final": 5.0e-3, "alpha": 5.0e-3},
        "rollout": {
            "guided_decoding": False,
            "history_turns": -1,
            "sampling": {"temperature": 0.0, "max_new_tokens": new_tokens, "min_new_tokens": new_tokens},
        },
        "steps": 1,
        "eval_tasks": 1,
        "eval_every": 0,
        "seed": 0,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="0.5b", help="model shape (tiny: a CPU dry run)")
    parser.add_argument("--device", default="cuda", help="model.device of every run (cpu: dry run without a GPU)")
    parser.add_argument("--population", type=int, default=8, help="G")
    parser.add_argument("--tasks", type=int, default=8, help="N tasks per member")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens generated per reply")
    parser.add_argument("--runs", default=RUNS, help="benchmarks.bench runs (comma-separated)")
    parser.add_argument("--out", default="gpu_check_results", help="output directory")
    args = parser.parse_args(argv)

    from benchmarks import bench

    with tempfile.TemporaryDirectory(prefix="esopt-gpu-check-") as tmp:
        model_dir = Path(tmp) / f"random-{args.shape}"
        parameters = build_model(args.shape, model_dir)
        print(f"built a random {args.shape} Llama: {parameters / 1e6:.0f}M parameters", flush=True)
        config = Path(tmp) / "workload.yaml"
        config.write_text(yaml.safe_dump(workload(model_dir, args.device, args.new_tokens)))
        bench.main([
            "--config", str(config), "--population", str(args.population), "--tasks", str(args.tasks),
            "--steps", "1", "--runs", args.runs, "--out", args.out,
            "--grpo-config", "configs/grpo_sudoku_demo.yaml",
        ])
    summary = Path(args.out) / "bench.md"
    summary.write_text(f"Random {args.shape} Llama ({parameters / 1e6:.0f}M parameters) on {args.device}.\n\n" + summary.read_text())


if __name__ == "__main__":
    main()
