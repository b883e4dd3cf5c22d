"""ESConfig: every evolution-strategy setting with its help text, and its rules (`check`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from esopt.confutil import Config, ConfigError, is_int, opt
from esopt.es.noise import DEFAULT_TABLE_SIZE, noise_from_config
from esopt.es.optimizers import optimizer_from_config
from esopt.es.scope import SCOPES, Scope
from esopt.es.shaping import SHAPING_METHODS
from esopt.es.strategies import STRATEGIES

__all__ = ["ESConfig"]



def _is_real(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass
class ESConfig(Config):
    """Evolution-strategy hyperparameters (population, noise, step size and their schedules, optimizer, scope)."""

    strategy: str = opt(
        "agentic-esopt",
        help="'agentic-esopt' (sigma cosine-decays from sigma to sigma_final), 'vanilla-es' (constant sigma) or "
        "'copes' (cosine sigma; each step a fresh random partition of all weights into K subspaces, G/K members "
        "per subspace, each perturbing only its subspace with sigma*sqrt(K))",
    )
    subspaces: int = opt(4, help="K, the number of disjoint parameter subspaces per step (copes only)")
    population: int = opt(8, help="G: members evaluated per step (must be even when antithetic)")
    sigma: float = opt(1e-3, help="sigma_0: perturbation scale at the first step")
    sigma_final: float = opt(2.5e-4, help="sigma_T: perturbation scale at the last step (agentic-esopt, copes)")
    alpha: float = opt(
        5e-4,
        help="step size alpha (1/sigma folded in): theta += alpha * g with g = 1/G * sum_i z_i eps_i (optimizer sgd; "
        "with adam it is the per-weight step size)",
    )
    alpha_final: float | None = opt(
        None, help="if set, alpha cosine-decays from alpha to alpha_final; if null, alpha is constant"
    )
    warmup_steps: int = opt(0, help="steps of linear warmup applied to both the sigma and alpha schedules")
    antithetic: bool = opt(False, help="evaluate each seed at +sigma*eps and -sigma*eps (population G/2 seeds)")
    shaping: str = opt("zscore", help="fitness shaping: 'zscore' (population z-score) or 'rank' (centered ranks)")
    noise: str = opt(
        "full",
        help="'full' (i.i.d. N(0,1) for every weight, drawn from per-member streams), 'table' (full-rank too: each "
        "tensor's noise is a slice of one shared N(0,1) table at an offset hashed from (member seed, tensor name), "
        "OpenAI-ES style; reading a slice is much cheaper than drawing fresh normals, for table_size*4 bytes of "
        "memory) or 'lowrank' (EGGROLL: each 2-D weight W (m x n) moves along A B^T / sqrt(rank), A (m x rank), "
        "B (n x rank); lets the local evaluator run the whole population in one batched forward that shares the "
        "base weights)",
    )
    table_size: int = opt(DEFAULT_TABLE_SIZE, help="noise=table: entries of the shared noise table (float32; >= the largest tensor)")
    rank: int = opt(1, help="r, the rank of each member's perturbation of a 2-D weight (noise=lowrank only)")
    lowrank_vectors: str = opt(
        "frozen",
        help="noise=lowrank: what happens to non-matrix tensors (norm weights, biases): 'frozen' (never perturbed "
        "or updated; keeps population batching possible) or 'full' (full-rank noise; members then run one after "
        "another with materialised weights)",
    )
    scope: str = opt(
        "all",
        help="which weights ES perturbs and updates (the others stay bit-identical): "
        + "; ".join(f"'{name}' ({meaning})" for name, meaning in SCOPES.items())
        + ". Read from Hugging Face tensor names (model.layers.N.self_attn.q_proj.weight, ...)",
    )
    optimizer: str = opt(
        "sgd",
        help="what the ES gradient estimate g = 1/G * sum_i z_i eps_i does to the weights: 'sgd' (theta += alpha*g), "
        "'momentum' (v = momentum*v + g; theta += alpha*v) or 'adam' (OpenAI-ES; Adam's per-weight normalisation of "
        "a noisy ES estimate acts like sign-SGD, so every weight moves by about alpha per step: take alpha well "
        "below sigma). Its fp32 state is saved with every checkpoint, so resume and replay stay bit-exact",
    )
    momentum: float = opt(0.9, help="optimizer=momentum: beta, the decay of the velocity (steady steps grow to alpha/(1-beta))")
    adam_beta1: float = opt(0.9, help="optimizer=adam: decay of the first-moment estimate")
    adam_beta2: float = opt(0.999, help="optimizer=adam: decay of the second-moment estimate")
    adam_eps: float = opt(1e-8, help="optimizer=adam: added to sqrt(second moment) before dividing")
    weight_decay: float = opt(
        0.0,
        help="each update also pulls the weights toward the base model: theta -= alpha * weight_decay * "
        "(theta - theta_base); > 0 keeps an fp32 copy of the base weights (in scope) with the optimizer state",
    )

    def check(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"es.strategy: unknown strategy {self.strategy!r}; expected one of {', '.join(STRATEGIES)}")
        if not is_int(self.population) or self.population < 1:
            raise ConfigError(f"es.population must be an integer >= 1, got {self.population!r}")
        if not isinstance(self.antithetic, bool):
            raise ConfigError(f"es.antithetic must be true or false, got {self.antithetic!r}")
        if self.antithetic and self.population % 2:
            raise ConfigError(f"es.population must be even with es.antithetic=true, got {self.population}")
        if not _is_real(self.sigma) or self.sigma <= 0:
            raise ConfigError(f"es.sigma must be a finite number > 0, got {self.sigma!r}")
        if STRATEGIES[self.strategy].sigma_decays and (not _is_real(self.sigma_final) or self.sigma_final <= 0):
            raise ConfigError(f"es.sigma_final must be a finite number > 0, got {self.sigma_final!r}")
        if not _is_real(self.alpha) or self.alpha < 0:
            raise ConfigError(f"es.alpha must be a finite number >= 0, got {self.alpha!r}")
        if self.alpha_final is not None and (not _is_real(self.alpha_final) or self.alpha_final < 0):
            raise ConfigError(f"es.alpha_final must be null or a finite number >= 0, got {self.alpha_final!r}")
        if not is_int(self.warmup_steps) or self.warmup_steps < 0:
            raise ConfigError(f"es.warmup_steps must be an integer >= 0, got {self.warmup_steps!r}")
        if self.shaping not in SHAPING_METHODS:
            raise ConfigError(f"es.shaping: unknown method {self.shaping!r}; expected one of {', '.join(SHAPING_METHODS)}")
        noise_from_config(self)
        Scope(self.scope)
        optimizer = optimizer_from_config(self)
        largest_alpha = max(self.alpha, self.alpha_final or 0.0)
        if optimizer.weight_decay * largest_alpha > 1.0:
            raise ConfigError(
                f"es.weight_decay * es.alpha must be <= 1 (a larger pull overshoots the base weights), "
                f"got {optimizer.weight_decay} * {largest_alpha}"
            )
        STRATEGIES[self.strategy].validate_config(self)
