"""What a run's numbers depend on besides its config and seed: library versions and the kernels that
do its arithmetic.

A bf16 forward pass is deterministic on one machine, but oneDNN picks its matmul kernel by what the CPU
offers (AMX tiles, AVX512-BF16, plain AVX512 or AVX2), and each rounds differently; on an AMX CPU so does
the number of threads a matmul is split over (`model.threads`, by default the CPU's cores). Greedy decisions near
a tie then flip, and an ES run, whose fitness values steer every later step, follows another path: on a
machine with another kernel, `esopt train` with the same config and seed is a different run, like
another seed. (The ES history is numerics-free: `esopt replay` rebuilds the same weights anywhere.)
Every run directory keeps this record as machine.json, its report prints it, and a resume on a machine
that differs says so.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
from pathlib import Path

RECORD_FILE = "machine.json"

# CPU features that change which bf16 matmul kernel oneDNN runs, fastest first.
BF16_KERNEL_FLAGS = ("amx_bf16", "avx512_bf16", "avx512f", "avx2")


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpuinfo_field(name: str) -> str | None:
    """The first `name : value` line of /proc/cpuinfo (None off Linux)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return None
    return next((line.split(":", 1)[1].strip() for line in lines if line.split(":", 1)[0].strip() == name), None)


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AMX or AVX512-BF16). Without it oneDNN converts to fp32
    around every matmul: on an AVX2-only EPYC a bf16 matmul measured 4.3x slower than fp32, an ES step 6x."""
    flags = set((_cpuinfo_field("flags") or "").split())
    return bool(flags & {"amx_bf16", "avx512_bf16"})


def machine_record() -> dict:
    """The versions and kernel path this process computes with."""
    import torch

    flags = set((_cpuinfo_field("flags") or "").split())
    return {
        "esopt": _version("esopt"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "tokenizers": _version("tokenizers"),
        "cpu": _cpuinfo_field("model name") or platform.processor() or platform.machine(),
        "cpu_bf16_kernel": next((flag for flag in BF16_KERNEL_FLAGS if flag in flags), "unknown"),
        "cpu_cores": os.cpu_count(),
        "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA"),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def write_record(run_dir: Path) -> None:
    (Path(run_dir) / RECORD_FILE).write_text(json.dumps(machine_record(), indent=1) + "\n")


def read_record(run_dir: Path) -> dict | None:
    path = Path(run_dir) / RECORD_FILE
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return None


def changes_since(run_dir: Path) -> list[str]:
    """How this machine differs from the one that started the run in `run_dir` ([] if it does not, or if
    the run predates machine.json)."""
    recorded = read_record(run_dir)
    return differences(recorded, machine_record()) if recorded else []


def describe(record: dict) -> str:
    """One line for a report: 'esopt 0.1.0, torch 2.13.0+cpu, transformers 5.24.0, CPU <model>, 2 cores, bf16 kernel
    amx_bf16'."""
    kernel = record.get("cpu_bf16_kernel")
    if record.get("onednn_max_cpu_isa"):
        kernel = f"{kernel}, capped at ONEDNN_MAX_CPU_ISA={record['onednn_max_cpu_isa']}"
    cores = f"{record['cpu_cores']} cores, " if record.get("cpu_cores") else ""
    where = f"GPU {record['cuda']}" if record.get("cuda") else f"CPU {record.get('cpu')}, {cores}bf16 kernel {kernel}"
    return f"esopt {record.get('esopt')}, torch {record.get('torch')}, transformers {record.get('transformers')}, {where}"


def differences(recorded: dict, current: dict) -> list[str]:
    """'key: old -> new' for every recorded field the current machine does not match."""
    return [f"{key}: {recorded[key]} -> {current.get(key)}" for key in recorded if recorded[key] != current.get(key)]
