"""ES training vs pure inference on one workload: throughput, step time split and peak memory, side by side.

    python -m benchmarks.bench [--config configs/bench_decode.yaml] [--population 8] [--tasks 8] [--steps 1]
                               [--rank 1] [--runs inference,es-full,es-table,es-lowrank,grpo,vllm,es-vllm-full,es-vllm-lowrank]
                               [--vllm-python .venv-vllm/bin/python]

Every run is its own child process (a process's peak RSS only grows, so runs sharing a process would
hide each other's peaks); each loads the model, warms up with one untimed rollout at the timed shapes,
then does the same work on the same tasks (those the ES trainer draws for steps 0..steps-1):

  inference   G rollouts of the N tasks per step with the unperturbed model: the batch shapes of
              full-rank ES, whose members run one after another (the limit full-rank ES can reach)
  inference-batched
              one rollout of the G*N episodes per step: the batch shape of low-rank ES (its limit)
  es-full     ES training steps, full-rank Gaussian noise drawn per member (es.noise=full); members
              one after another; perturb, rollouts, restore and update all timed
  es-table    the same with full-rank noise read from the shared noise table (es.noise=table)
  es-lowrank  the same with low-rank noise (es.noise=lowrank, rank r): the G members population-batched
              into one rollout of G*N episodes over the shared base weights
  grpo        one GRPO step (rollouts + backprop + AdamW) on G*N episodes: memory only
  vllm        inference on the vLLM backend (the fastest engine installed), G*N episodes per step in one
              batch: run when --vllm-python (default .venv-vllm/bin/python, built by `make test-vllm`)
              exists. The prefix cache is reset before each timed rollout: ES resets it after every
              weight change, so inference must not get cache hits ES never gets
  es-vllm-full
              full-rank ES on the vLLM backend (noise table): members one after another, each written into
              the engine by one weight reload from the noise table inside the worker (the next member's
              write or the step's update replaces it: no restore in between)
  es-vllm-lowrank
              low-rank ES on the vLLM backend: each member a LoRA adapter built from its seed, all G*N
              episodes of a step in one generate call, the base weights updated once per step

Throughput is generated tokens per second of wall-clock. The default workload fixes every reply at 64
tokens (sampling.min_new_tokens), so every run does the same work; with free-length replies, members
that stop early would make episodes/s flatter them and tokens/s penalise them. Each ES step's time
split comes from the trainer's own timers. `--repeats R` runs the throughput measurements R times,
round-robin, and reports the median. The scaling table runs every ES run of --runs once more at each
population size G of --scaling with the episodes per step fixed (N = G x N / G), so the cost of a
larger population shows at equal work. Every run loads the model as its kind needs it: inference
holds the model alone (the fp32 master copy is made on the first weight change), ES and GRPO the model
and the master. Writes bench_results/bench.json and bench.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNS = ("inference", "inference-batched", "es-full", "es-table", "es-lowrank", "grpo", "vllm", "es-vllm-full", "es-vllm-lowrank")
ES_NOISE = {"es-full": "full", "es-table": "table", "es-lowrank": "lowrank", "es-vllm-full": "table", "es-vllm-lowrank": "lowrank"}
VLLM_RUNS = ("vllm", "es-vllm-full", "es-vllm-lowrank")
SPLIT = ("generate_s", "env_s", "perturb_s", "restore_s", "update_s")
OVERHEAD = ("perturb_s", "restore_s", "update_s")
MEMORY_ONLY = ("grpo",)


def _config(args):
    from esopt.train.config import load_config

    config = load_config(args.config)
    config.es.population, config.tasks_per_step, config.steps = args.population, args.tasks, args.steps
    config.eval_tasks, config.eval_every, config.trajectories_per_step = 1, 0, 0
    config.probe_tasks = 0  # the forgetting probe runs outside the timed steps: only time lost
    return config


def _child(kind: str, args) -> dict:
    from esopt.envs import make_env
    from esopt.policy import load_policy
    from esopt.rollout import rollout
    from esopt.train.es_trainer import engine_model_config, step_work
    from esopt.train.logging import peak_rss_mb

    config = _config(args)
    if kind in VLLM_RUNS:
        import vllm  # noqa: F401  (its import belongs to the floor, not to the model)

        config.model.backend = "vllm"
    if kind in ES_NOISE:
        config.es.noise, config.es.rank, config.es.lowrank_vectors = ES_NOISE[kind], args.rank, "frozen"
    floor = peak_rss_mb()  # interpreter and libraries: what every run of this kind pays before the model
    t = time.perf_counter()
    policy = load_policy(engine_model_config(config))
    out: dict = {"kind": kind, "load_s": time.perf_counter() - t, "floor_rss_mb": floor, "loaded_rss_mb": peak_rss_mb()}
    gpu = _uses_cuda(policy)
    if gpu:
        import torch

        out["loaded_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
    env = make_env(config.env.name, config.env.options)
    warm_tasks, _ = step_work(config, env, 0)
    rollout(policy, env, warm_tasks, config.rollout)  # untimed: kernels and caches at the timed shapes

    if kind in ("inference", "inference-batched", "vllm"):
        tokens = episodes = 0
        g = config.es.population
        wall, cpu = time.perf_counter(), time.process_time()
        for step in range(config.steps):
            tasks, seed = step_work(config, env, step)
            for batch in [tasks * g] if kind in ("inference-batched", "vllm") else [tasks] * g:
                if kind == "vllm":
                    policy.reset_prefix_cache()  # as after every ES weight change
                result = rollout(policy, env, batch, config.rollout, seed=seed)
                tokens += result.generated_tokens
                episodes += len(result.trajectories)
        seconds = time.perf_counter() - wall
        out.update(seconds=seconds, cpu_s=time.process_time() - cpu, tokens=tokens, episodes=episodes)
    elif kind in ES_NOISE:
        from rich.console import Console

        from esopt.train.es_trainer import ESTrainer
        from esopt.train.logging import read_metrics

        with tempfile.TemporaryDirectory() as runs:
            config.runs_dir, config.run_name = runs, kind
            cpu = time.process_time()
            ESTrainer.start(config, policy=policy, console=Console(quiet=True)).run()
            cpu_s = time.process_time() - cpu
            steps = [r for r in read_metrics(Path(runs) / kind) if "time/step_s" in r]
        seconds = sum(r["time/step_s"] for r in steps)
        out.update(
            seconds=seconds,
            cpu_s=cpu_s,  # includes saving the final checkpoint: per-CPU-second figures are approximate
            tokens=sum(r["train/generated_tokens"] for r in steps),
            episodes=len(steps) * config.es.population * config.tasks_per_step,
            split={k: sum(r[f"time/{k}"] for r in steps) / seconds for k in SPLIT},
            fitness_mean=[r["train/fitness_mean"] for r in steps],
            generate_calls=getattr(policy, "generate_calls", None),
        )
    elif kind == "grpo":
        from rich.console import Console

        from esopt.baselines.grpo import GRPOConfig, GRPOTrainer
        from esopt.confutil import load_yaml

        grpo = load_yaml(GRPOConfig, args.grpo_config)
        grpo.model, grpo.env, grpo.rollout = config.model, config.env, config.rollout
        grpo.group_size = args.group_size
        grpo.tasks_per_step = max(1, args.population * args.tasks // args.group_size)
        grpo.steps, grpo.eval_tasks, grpo.trajectories_per_step = 1, 1, 0
        with tempfile.TemporaryDirectory() as runs:
            grpo.runs_dir, grpo.run_name = runs, "grpo"
            trainer = GRPOTrainer.start(grpo, policy=policy, console=Console(quiet=True))
            t = time.perf_counter()
            trainer.train_step(0)
            out.update(seconds=time.perf_counter() - t, episodes=grpo.tasks_per_step * grpo.group_size)
    out["peak_rss_mb"] = peak_rss_mb()
    if gpu:
        out["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return out


def _uses_cuda(policy) -> bool:
    """Whether the policy's model sits on a CUDA device (the HF backend; its peak GPU memory is then measured)."""
    model = getattr(policy, "model", None)
    return model is not None and getattr(model, "device", None) is not None and model.device.type == "cuda"


def _run_child(kind: str, python: str, argv: list[str]) -> dict | None:
    """The child's numbers, or None (its error printed) when it failed: the other runs still report."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        command = [python, "-m", "benchmarks.bench", *argv, "--child", kind, "--child-out", f.name]
        t = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, env=_child_env(kind))
        if done.returncode:
            print(f"[{kind}] FAILED ({done.returncode}):\n{done.stderr[-3000:]}", flush=True)
            return None
        result = json.loads(Path(f.name).read_text())
    print(f"[{kind}] done in {time.perf_counter() - t:.0f} s", flush=True)
    return result


def _child_env(kind: str) -> dict:
    env = dict(os.environ)
    if kind in VLLM_RUNS:
        env.setdefault("HF_HUB_OFFLINE", "1")
    return env


def _median_run(runs: list[dict]) -> dict:
    """The run with the median time (the lower one for an even count), with the spread of all of them."""
    ordered = sorted(runs, key=lambda r: r["seconds"])
    chosen = dict(ordered[(len(ordered) - 1) // 2])
    chosen["repeats"] = len(runs)
    chosen["seconds_range"] = [ordered[0]["seconds"], ordered[-1]["seconds"]]
    chosen["peak_rss_mb"] = max(r["peak_rss_mb"] for r in runs)
    return chosen


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _tokens_per_s(run: dict | None) -> float | None:
    return run["tokens"] / run["seconds"] if run and run.get("tokens") else None


def _table(args, results: dict) -> tuple[list[str], dict]:
    def rate(kind):
        return _tokens_per_s(results.get(kind))

    inference, full = rate("inference"), rate("es-full")
    ratios: dict[str, float] = {}
    lines = [
        f"Workload: {args.config}, G={args.population} members x N={args.tasks} tasks, {args.steps} step(s) "
        f"({args.population * args.tasks * args.steps} episodes per run); low-rank r={args.rank}; GRPO K={args.group_size}.",
        "",
        "| run | episodes | generated tokens | seconds (median; range) | tokens/s | / inference | peak RSS (MB) | RSS / inference | peak - floor (MB) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    base_rss = results["inference"]["peak_rss_mb"] if "inference" in results else None
    for kind, r in results.items():
        tps = rate(kind)
        over = tps / inference if tps and inference else None
        rss_over = r["peak_rss_mb"] / base_rss if base_rss else None
        if over is not None and kind != "inference":
            ratios[f"{kind}_over_inference"] = over
        if rss_over is not None and kind != "inference":
            ratios[f"{kind}_rss_over_inference"] = rss_over
        low, high = r["seconds_range"]
        seconds = f"{r['seconds']:.1f}" + (f" ({low:.1f}-{high:.1f})" if r["repeats"] > 1 else "")
        cells = [kind, r.get("episodes", "-"), r.get("tokens", "-"), seconds, _fmt(tps, ".1f"),
                 _fmt(over, ".2f"), f"{r['peak_rss_mb']:.0f}", _fmt(rss_over, ".2f"),
                 _fmt(r["peak_rss_mb"] - r["floor_rss_mb"] if "floor_rss_mb" in r else None, ".0f")]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    if rate("es-lowrank") and full:
        ratios["es-lowrank_over_es-full"] = rate("es-lowrank") / full
    if rate("es-lowrank") and rate("inference-batched"):
        ratios["es-lowrank_over_inference-batched"] = rate("es-lowrank") / rate("inference-batched")
        ratios["es-lowrank_rss_over_inference-batched"] = (
            results["es-lowrank"]["peak_rss_mb"] / results["inference-batched"]["peak_rss_mb"]
        )
    if rate("es-vllm-lowrank") and rate("vllm"):
        ratios["es-vllm-lowrank_over_vllm"] = rate("es-vllm-lowrank") / rate("vllm")
        ratios["es-vllm-lowrank_rss_over_vllm"] = results["es-vllm-lowrank"]["peak_rss_mb"] / results["vllm"]["peak_rss_mb"]
    if rate("es-vllm-full") and rate("vllm"):
        ratios["es-vllm-full_over_vllm"] = rate("es-vllm-full") / rate("vllm")
    if rate("es-vllm-lowrank") and rate("es-lowrank"):
        ratios["es-vllm-lowrank_over_es-lowrank"] = rate("es-vllm-lowrank") / rate("es-lowrank")
    if rate("es-table") and full:
        ratios["es-table_over_es-full"] = rate("es-table") / full
    if "grpo" in results:
        for kind in ES_NOISE:
            if kind in results:
                ratios[f"grpo_rss_over_{kind}"] = results["grpo"]["peak_rss_mb"] / results[kind]["peak_rss_mb"]
    if any("peak_gpu_mb" in r for r in results.values()):
        lines += [
            "",
            "Peak GPU memory (torch.cuda.max_memory_allocated):",
            "",
            "| run | after load (MB) | peak (MB) | peak - after load (MB) |",
            "|---|---|---|---|",
        ]
        for kind, r in results.items():
            if "peak_gpu_mb" in r:
                lines.append(f"| {kind} | {r['loaded_gpu_mb']:.0f} | {r['peak_gpu_mb']:.0f} | {r['peak_gpu_mb'] - r['loaded_gpu_mb']:.0f} |")
        for kind in ES_NOISE:
            if "peak_gpu_mb" in results.get(kind, {}) and "peak_gpu_mb" in results.get("grpo", {}):
                ratios[f"grpo_gpu_over_{kind}"] = results["grpo"]["peak_gpu_mb"] / results[kind]["peak_gpu_mb"]
    splits = {k: r["split"] for k, r in results.items() if "split" in r}
    if splits:
        lines += [
            "",
            "ES step time split (share of the step's wall-clock):",
            "",
            "| run | " + " | ".join(s[:-2] for s in SPLIT) + " | perturb+restore+update |",
            "|---|" + "---|" * (len(SPLIT) + 1),
        ]
        for kind, split in splits.items():
            overhead = sum(split[s] for s in OVERHEAD)
            ratios[f"{kind}_overhead_share"] = overhead
            lines.append(f"| {kind} | " + " | ".join(f"{split[s]:.1%}" for s in SPLIT) + f" | {overhead:.1%} |")
    if ratios:
        lines += ["", "Ratios: " + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items())]
    return lines, ratios


def _scaling(args, argv: list[str], kinds: list[str], failed: list[str]) -> list[dict]:
    """Each ES run again at every population size of --scaling, the episodes per step (G x N) fixed."""
    episodes = args.population * args.tasks
    rows = []
    for g in [int(x) for x in args.scaling.split(",") if x.strip()]:
        n = max(1, episodes // g)
        for kind in kinds:
            python = args.vllm_python if kind in VLLM_RUNS else sys.executable
            result = _run_child(kind, python, [*argv, "--population", str(g), "--tasks", str(n)])
            if result is None:
                failed.append(f"{kind} at G={g}")
            else:
                rows.append({"population": g, "tasks": n, **result})
    return rows


def _scaling_table(args, results: dict, rows: list[dict]) -> list[str]:
    if not rows:
        return []
    reference = {"hf": results.get("inference-batched"), "vllm": results.get("vllm")}
    lines = [
        "",
        f"Scaling: the same {args.population * args.tasks} episodes per step split over a growing population "
        "(one run each; / inference: over inference-batched for the HF runs, over vllm for the vLLM runs, from the table above):",
        "",
        "| run | G | N | tokens/s | / inference | peak RSS (MB) | peak - floor (MB) | perturb+restore+update |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (r["kind"], r["population"])):
        tps = _tokens_per_s(r)
        ref = _tokens_per_s(reference["vllm" if r["kind"] in VLLM_RUNS else "hf"])
        over = tps / ref if tps and ref else None
        overhead = sum(r["split"][k] for k in OVERHEAD) if "split" in r else None
        lines.append(
            f"| {r['kind']} | {r['population']} | {r['tasks']} | {_fmt(tps, '.1f')} | {_fmt(over, '.2f')} | "
            f"{r['peak_rss_mb']:.0f} | {r['peak_rss_mb'] - r['floor_rss_mb']:.0f} | {_fmt(overhead, '.1%')} |"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/bench_decode.yaml", help="workload (model, env, rollout)")
    parser.add_argument("--population", type=int, default=8, help="G")
    parser.add_argument("--tasks", type=int, default=8, help="N tasks per member")
    parser.add_argument("--steps", type=int, default=1, help="ES steps timed (inference does the same rollouts)")
    parser.add_argument("--rank", type=int, default=1, help="rank r of the low-rank run")
    parser.add_argument("--group-size", type=int, default=4, help="GRPO samples per task (K)")
    parser.add_argument("--grpo-config", default="configs/grpo_sudoku_demo.yaml", help="GRPO optimiser settings")
    parser.add_argument("--repeats", type=int, default=1, help="run each throughput measurement this many times (median)")
    parser.add_argument("--runs", default=",".join(RUNS), help="comma-separated subset of " + ",".join(RUNS))
    parser.add_argument("--vllm-python", default=".venv-vllm/bin/python", help="interpreter with the vllm extra")
    parser.add_argument(
        "--scaling", default="4,8,16,32",
        help="population sizes G for the scaling table: each ES run again at every G with N = G*N/G tasks ('' = none)",
    )
    parser.add_argument("--out", default="bench_results", help="output directory")
    parser.add_argument("--child", choices=RUNS, help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if args.child:
        Path(args.child_out).write_text(json.dumps(_child(args.child, args)))
        return

    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    unknown = sorted(set(runs) - set(RUNS))
    if unknown:
        parser.error(f"unknown run(s) {unknown}; choose from {', '.join(RUNS)}")
    for kind in [k for k in runs if k in VLLM_RUNS]:
        if not Path(args.vllm_python).exists():
            print(f"[{kind}] skipped: {args.vllm_python} not found (`make test-vllm` builds it)", flush=True)
            runs.remove(kind)
    # Round-robin repeats: this machine's speed drifts by ~10% over tens of seconds, and interleaving the
    # runs spreads that drift over all of them instead of charging it to whichever ran in a slow phase.
    repeats: dict[str, list[dict]] = {kind: [] for kind in runs}
    failed = []
    for round_ in range(args.repeats):
        for kind in runs:
            if kind in failed or (round_ and kind in MEMORY_ONLY):
                continue
            result = _run_child(kind, args.vllm_python if kind in VLLM_RUNS else sys.executable, argv)
            if result is None:
                failed.append(kind)
            else:
                repeats[kind].append(result)
    results = {kind: _median_run(rs) for kind, rs in repeats.items() if rs}
    lines, ratios = _table(args, results)
    scaling = _scaling(args, argv, [k for k in runs if k in ES_NOISE and k not in failed], failed)
    lines += _scaling_table(args, results, scaling)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(
        json.dumps({"args": vars(args), "results": results, "ratios": ratios, "repeats": repeats, "scaling": scaling}, indent=2)
    )
    (out / "bench.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if failed:
        raise SystemExit(f"failed run(s): {', '.join(failed)} (the others are in {out}/bench.md)")


if __name__ == "__main__":
    main()
