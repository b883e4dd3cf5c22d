"""`esopt landscape`: mean reward over a 2-D slice of weight space, theta + a*s*eps1 + b*s*eps2, where eps1
and eps2 are two seeded ES noise directions and s a perturbation scale (the Agentic ESOpt paper's Figure 6).
A flat slice at the run's sigma means no member can change an outcome: ES gets no signal there."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from esopt.confutil import ConfigError
from esopt.envs.base import Env, Task
from esopt.es import STRATEGIES, ESConfig, Scope, Update, derive_seed, tensors_moved
from esopt.es.noise import noise_from_config
from esopt.policy.base import Policy
from esopt.rollout import RolloutConfig, rollout


def grid_coordinates(points: int, span: float) -> list[float]:
    """`points` (>= 2) evenly spaced multiples of the scale from -span to +span (0 is one of them when points is odd)."""
    if points < 2:
        raise ValueError(f"a landscape grid needs at least 2 points per axis, got {points}")
    return [float(x) for x in np.linspace(-span, span, points)]


def direction_seeds(seed: int) -> tuple[int, int]:
    """The noise seeds of the slice's two directions (distinct, derived from the scan's seed)."""
    return derive_seed(seed, "landscape", 0), derive_seed(seed, "landscape", 1)


def scan_landscape(
    policy: Policy,
    env: Env,
    tasks: list[Task],
    rollout_config: RolloutConfig,
    es: ESConfig,
    scales: list[float],
    points: int = 5,
    span: float = 2.0,
    seed: int = 0,
    on_point=None,
) -> dict:
    """Mean reward and success of `tasks` at theta + a*s*eps1 + b*s*eps2 for every (a, b) on the grid and every
    scale s, with the noise kind and scope of `es`; every point decodes with the same seed (common random
    numbers), so a difference between points comes from the weights alone. The policy's weights are restored
    bit-exactly afterwards (checked by fingerprint). `on_point()` is called after each evaluated point."""
    master = policy.master_weights()
    noise, scope = noise_from_config(es), Scope(es.scope)
    scope.check(master)
    noise.prepare(master)
    seeds = direction_seeds(seed)
    coords = grid_coordinates(points, span)
    decode_seed = derive_seed(seed, "landscape", "decode")

    def evaluate() -> tuple[float, float, list[float]]:
        result = rollout(policy, env, tasks, rollout_config, seed=decode_seed)
        rewards = [t.reward for t in result.trajectories]
        return result.metrics["mean_reward"], result.metrics["success"], rewards

    fingerprint = policy.fingerprint()
    base_reward, base_success, base_rewards = evaluate()
    if on_point:
        on_point()
    # A point is reached by applying one plain-SGD update (alpha/G * sum c_i eps_i with G = 2, so
    # alpha = 2s and c = (a, b) give a*s*eps1 + b*s*eps2) and left by copying the saved tensors back.
    probe = Update(step=0, seeds=list(seeds), coefficients=[0.0, 0.0], alpha=0.0, sigma=0.0, fitness=[], noise=noise, scope=scope)
    moved = tensors_moved(probe, master)
    saved = {name: master[name].clone() for name in moved}
    restore = {**master, **saved}
    slices = []
    try:
        for scale in scales:
            rewards = np.zeros((points, points))
            successes = np.zeros((points, points))
            changed = [False] * len(tasks)
            for i, a in enumerate(coords):
                for j, b in enumerate(coords):
                    point = dataclasses.replace(probe, coefficients=[a, b], alpha=2.0 * scale, sigma=scale)
                    policy.apply(point)
                    try:
                        rewards[i, j], successes[i, j], per_task = evaluate()
                    finally:
                        policy.load_master_weights(restore)
                    changed = [c or r != r0 for c, r, r0 in zip(changed, per_task, base_rewards)]
                    if on_point:
                        on_point()
            slices.append(
                {
                    "scale": scale,
                    "mean_reward": rewards.tolist(),
                    "success": successes.tolist(),
                    "tasks_changed": sum(changed),
                }
            )
    finally:
        policy.load_master_weights(restore)
    if policy.fingerprint() != fingerprint:
        raise RuntimeError("landscape scan did not restore the weights exactly")
    return {
        "coords": coords,
        "direction_seeds": list(seeds),
        "decode_seed": decode_seed,
        "tasks": len(tasks),
        "noise": noise.to_json(),
        "scope": scope.spec,
        "base": {"mean_reward": base_reward, "success": base_success},
        "slices": slices,
    }


def slice_line(result: dict, piece: dict) -> str:
    """One line per scale: the range of mean reward over the grid, and how many tasks change outcome anywhere."""
    values = np.array(piece["mean_reward"])
    return (
        f"scale {piece['scale']:g}: mean reward {values.min():.3f}..{values.max():.3f} "
        f"(unperturbed {result['base']['mean_reward']:.3f}); {piece['tasks_changed']} of {result['tasks']} tasks "
        "change reward somewhere on the grid"
    )


def landscape_markdown(result: dict, title: str) -> str:
    """landscape.md: one table of mean reward per scale (rows a, columns b, in units of the scale)."""
    coords = result["coords"]
    lines = [
        f"# Reward landscape: {title}",
        "",
        f"Mean reward of {result['tasks']} tasks at theta + a*s*eps1 + b*s*eps2 ({result['noise']['kind']} noise, "
        f"scope {result['scope']}, direction seeds {result['direction_seeds']}); unperturbed "
        f"{result['base']['mean_reward']:.3f} (success {result['base']['success']:.3f}).",
        "",
    ]
    for piece in result["slices"]:
        lines += [
            f"## s = {piece['scale']:g}",
            "",
            slice_line(result, piece) + ".",
            "",
            "| a \\ b | " + " | ".join(f"{b:+g}" for b in coords) + " |",
            "|---|" + "---|" * len(coords),
            *[f"| {a:+g} | " + " | ".join(f"{v:.3f}" for v in row) + " |" for a, row in zip(coords, piece["mean_reward"])],
            "",
        ]
    return "\n".join(lines)


def plot_landscape(result: dict, path: Path, title: str) -> bool:
    """Heatmaps of mean reward, one per scale, on one colour scale; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    pieces = result["slices"]
    coords = result["coords"]
    values = np.array([p["mean_reward"] for p in pieces])
    low, high = float(values.min()), float(values.max())
    if low == high:  # a flat slice still gets a visible colour range
        low, high = low - 0.5, high + 0.5
    # Each cell is centred on its grid coordinate.
    half = (coords[-1] - coords[0]) / (len(coords) - 1) / 2
    extent = (coords[0] - half, coords[-1] + half, coords[0] - half, coords[-1] + half)
    fig, axes = plt.subplots(1, len(pieces), figsize=(4.8 * len(pieces) + 1, 4.4), squeeze=False, layout="constrained")
    for ax, piece in zip(axes[0], pieces):
        grid = np.array(piece["mean_reward"])
        image = ax.imshow(grid, origin="lower", vmin=low, vmax=high, cmap="viridis", extent=extent)
        if len(coords) <= 7:  # small grids: the numbers themselves, readable on the colour
            for i, a in enumerate(coords):
                for j, b in enumerate(coords):
                    shade = (grid[i, j] - low) / (high - low)
                    ax.text(b, a, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=8, color="black" if shade > 0.5 else "white")
        ax.set_title(f"s = {piece['scale']:g} ({piece['tasks_changed']}/{result['tasks']} tasks change)")
        ax.set_xticks(coords)
        ax.set_yticks(coords)
        ax.set_xlabel("b (units of s along eps2)")
        ax.set_ylabel("a (units of s along eps1)")
    fig.colorbar(image, ax=axes[0].tolist(), label="mean reward")
    fig.suptitle(title)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# ---- command line -----------------------------------------------------------------------------------
def resolve_target(spec: str):
    """(model path, the run's TrainConfig or None) for a run directory (its newest checkpoint), a model
    directory or 'default'; ConfigError for anything else."""
    from esopt.train.config import load_config
    from esopt.train.es_trainer import checkpoints

    path = Path(spec)
    if (path / "config.yaml").exists():
        found = checkpoints(path)
        if not found:
            raise ConfigError(f"run directory {path} has no complete checkpoint")
        return str(found[-1][1]), load_config(path / "config.yaml")
    if spec != "default" and not path.is_dir():
        raise ConfigError(f"{spec}: no such run directory or model directory (or use 'default')")
    return spec, None


def parse_scales(text: str) -> list[float]:
    try:
        scales = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--scales must be comma-separated numbers, got {text!r}") from None
    if not scales or any(not np.isfinite(s) or s <= 0 for s in scales):
        raise ConfigError(f"--scales must be positive numbers, got {text!r}")
    return scales


def main(argv: list[str]) -> int:
    """The `esopt landscape` command."""
    from rich.console import Console
    from rich.progress import Progress

    from esopt.envs import make_env
    from esopt.envs.base import SPLITS
    from esopt.policy import load_policy
    from esopt.runconfig import add_env_flags, argument_parser, env_overrides, flag_value
    from esopt.train.config import load_config

    parser = argument_parser(
        "esopt landscape",
        "Mean reward over a 2-D slice of weight space spanned by two seeded ES noise directions, "
        "at a few perturbation scales, as a heatmap: is sigma large enough to change outcomes?",
    )
    parser.add_argument("target", metavar="RUN_OR_MODEL", help="a run directory (its newest checkpoint, env and ES settings), a model directory or 'default'")
    parser.add_argument(
        "--tasks", type=int, default=16,
        help="number of tasks, the same at every point (default: 16); the scan costs 1 + grid^2 x scales rollouts of them",
    )
    parser.add_argument("--split", default="train", choices=SPLITS, help="task split (default: train, what ES fitness sees)")
    parser.add_argument("--grid", type=int, default=5, help="points per axis, from -span to +span in units of the scale (default: 5)")
    parser.add_argument("--span", type=float, default=2.0, help="the grid reaches +-span times the scale (default: 2)")
    parser.add_argument(
        "--scales", default="",
        help="comma-separated perturbation scales s (default: the run's sigma_0 and sigma_T; for a model, those of `esopt train`)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the tasks, the two directions and decoding (default: 0)")
    parser.add_argument("--out", help="output directory (default: RUN/landscape for a run, ./landscape for a model)")
    parser.add_argument(
        "--config",
        help="for a model: a training config (configs/*.yaml) whose env, rollout, model dtype and ES noise settings "
        "the scan uses, e.g. configs/sudoku_demo.yaml; env flags override it (default: `esopt train`'s defaults)",
    )
    add_env_flags(parser, flag_value(argv, "--env") or "sudoku")
    args = parser.parse_args(argv)
    if args.tasks < 1 or args.grid < 2 or args.span <= 0:
        raise ConfigError("--tasks must be >= 1, --grid >= 2 and --span > 0")
    model_path, run_config = resolve_target(args.target)
    if run_config is not None and (args.config or hasattr(args, "env_name") or env_overrides(args)):
        raise ConfigError("--config and env flags apply to a model; a run directory's settings come from its config.yaml")
    config = run_config or load_config(args.config)
    if run_config is None:
        if hasattr(args, "env_name") and args.env_name != config.env.name:
            config.env.name, config.env.options = args.env_name, {}
        config.env.options.update(env_overrides(args))
    sigma_final = config.es.sigma_final if STRATEGIES[config.es.strategy].sigma_decays else config.es.sigma
    scales = parse_scales(args.scales) if args.scales else sorted({config.es.sigma, sigma_final})
    env = make_env(config.env.name, config.env.options)
    tasks = env.tasks(args.split, args.tasks, args.seed)
    out = Path(args.out or (Path(args.target) / "landscape" if run_config else "landscape"))
    console = Console()
    policy = load_policy(dataclasses.replace(config.model, path=model_path))
    title = f"{args.target} on {config.env.name}/{args.split}"
    with Progress(console=console, transient=True) as progress:
        bar = progress.add_task("landscape points", total=1 + len(scales) * args.grid**2)
        result = scan_landscape(
            policy, env, tasks, config.rollout, config.es, scales, args.grid, args.span, args.seed,
            on_point=lambda: progress.advance(bar),
        )
    result.update(target=args.target, model=model_path, env=config.env.name, env_options=config.env.options, split=args.split, seed=args.seed)
    out.mkdir(parents=True, exist_ok=True)
    (out / "landscape.json").write_text(json.dumps(result, indent=1))
    (out / "landscape.md").write_text(landscape_markdown(result, title))
    plotted = plot_landscape(result, out / "landscape.png", title)
    for piece in result["slices"]:
        console.print(slice_line(result, piece))
    console.print(f"wrote {out}/landscape.json, landscape.md" + (", landscape.png" if plotted else " (no matplotlib: no heatmap)"))
    return 0
