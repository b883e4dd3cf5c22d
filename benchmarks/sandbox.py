"""Cost of OS isolation in esopt.sandbox: isolation="python" (in-process layer only) vs "bwrap", side by side.

    python -m benchmarks.sandbox [--calls 20] [--evaluations 5] [--task tsp50]

1. Start-up per call: `run_script("pass")`, which starts the interpreter, imports numpy and returns;
   the two isolations alternate call by call so that load on the machine hits both alike.
2. One full AHD evaluation: `task.evaluate(task.greedy_code)` on the task's default instances, the
   work an AHD run does per candidate, again alternating.
Reports the median of each, the milliseconds bwrap adds per call and the bwrap/python ratio (targets:
at most 100 ms added per call, at most 1.2x per evaluation).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

from esopt.ahd.tasks import get_task
from esopt.sandbox import Limits, require_isolation, run_script

ISOLATIONS = ("python", "bwrap")


def _alternate(n: int, run) -> dict[str, float]:
    """Median seconds of `run(isolation)` over n alternating rounds per isolation."""
    times: dict[str, list[float]] = {iso: [] for iso in ISOLATIONS}
    for i in range(n):
        for iso in ISOLATIONS if i % 2 == 0 else ISOLATIONS[::-1]:
            t0 = time.perf_counter()
            run(iso)
            times[iso].append(time.perf_counter() - t0)
    return {iso: statistics.median(ts) for iso, ts in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20, help="start-up measurements per isolation")
    parser.add_argument("--evaluations", type=int, default=5, help="AHD evaluations per isolation")
    parser.add_argument("--task", default="tsp50", help="AHD task whose greedy baseline is evaluated")
    args = parser.parse_args()

    require_isolation("bwrap")  # the one-time self-test is not part of what is measured

    def start_up(iso: str) -> None:
        res = run_script("pass", Limits(timeout_s=60.0, isolation=iso))
        if not res.ok:
            raise SystemExit(f"run_script failed under {iso}: {res.error}")

    task = get_task(args.task)
    task.evaluate(task.greedy_code)  # warm the parent side (instances, shipped modules)

    def evaluation(iso: str) -> None:
        ev = task.evaluate(task.greedy_code, limits=dataclasses.replace(task.default_limits, isolation=iso))
        if not ev.valid:
            raise SystemExit(f"{args.task} evaluation failed under {iso}: {ev.reason}")

    start = _alternate(args.calls, start_up)
    full = _alternate(args.evaluations, evaluation)
    print(f"{'measure':38s} {'python':>10s} {'bwrap':>10s} {'added':>10s} {'ratio':>7s}")
    for name, med in ((f"start-up per call (median of {args.calls})", start),
                      (f"{args.task} evaluation (median of {args.evaluations})", full)):
        added = med["bwrap"] - med["python"]
        print(f"{name:38s} {med['python'] * 1e3:8.1f}ms {med['bwrap'] * 1e3:8.1f}ms "
              f"{added * 1e3:+8.1f}ms {med['bwrap'] / med['python']:6.2f}x")


if __name__ == "__main__":
    main()
