"""The Policy contract: the one object that owns model weights.

The trainer and the rollout loop talk to a policy only through these calls, so
backends (HF transformers, vLLM, a remote endpoint) are interchangeable.
"""

from __future__ import annotations

import abc
import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from esopt.confutil import Config, ConfigError, opt
from esopt.es import Member, OptimizerState, Update

OPTIMIZER_FILE = "optimizer.safetensors"
"""The ES optimizer's state in a checkpoint directory, beside the model files (which from_pretrained reads)."""


@dataclass
class SamplingConfig(Config):
    temperature: float = opt(0.0, "sampling temperature; 0 = greedy decoding")
    top_p: float = opt(1.0, "nucleus sampling: keep the smallest token set with this much probability mass")
    top_k: int = opt(0, "keep only the k most likely tokens (0 = off)")
    max_new_tokens: int = opt(16, "maximum tokens generated per turn")
    min_new_tokens: int = opt(0, "end-of-sequence is suppressed until a reply has this many tokens (benchmarks: fixed-length replies)")
    stop: list = opt([], "strings that end a reply (the reply is cut before them)")

    def check(self) -> None:
        if self.temperature < 0:
            raise ConfigError(f"sampling.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"sampling.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ConfigError(f"sampling.top_k must be >= 0, got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ConfigError(f"sampling.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise ConfigError(
                f"sampling.min_new_tokens must be in [0, max_new_tokens={self.max_new_tokens}], got {self.min_new_tokens}"
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


Chat = list[dict]


class Policy(abc.ABC):
    """An LLM whose weights ES perturbs, restores and updates."""

    last_reply_tokens: Sequence[int] = ()
    """Set by every generate call: the number of tokens generated for each chat's reply (including an
    end-of-sequence token); empty when the backend does not count. Feeds the tokens/s metrics."""

    @abc.abstractmethod
    def generate(
        self,
        chats: list[Chat],
        sampling: SamplingConfig,
        action_regex: str | list[str | None] | None = None,
        seed: int = 0,
        members: list[Member | None] | None = None,
    ) -> list[str]:
        """One assistant reply per chat. With `action_regex` (one for all, or one per chat; None = free
        text), each reply is constrained to match its regex. With `members` (one per chat; None = the
        unperturbed weights), each chat is answered by its member's perturbed weights, all in one batched
        forward (population batching); only valid when `supports_population` says so."""

    def reply_logprobs(
        self, chats: list[Chat], replies: list[list[str]], members: list[Member | None] | None = None
    ) -> list[list[float]]:
        """log p(reply | chat) under the model (no temperature), for every candidate reply of every chat: the sum
        over the reply's tokens as the model writes them after the chat's generation prompt. `members` as in
        generate. Backends that cannot score replies raise NotImplementedError."""
        raise NotImplementedError(f"{type(self).__name__} cannot score replies (rollout.expected_reward needs the hf backend)")

    @abc.abstractmethod
    def perturbed(self, member: Member) -> contextlib.AbstractContextManager:
        """Context manager: weights are theta + sign*sigma*eps(member) inside, restored bit-exactly on exit."""

    def supports_population(self, members: Sequence[Member]) -> bool:
        """Whether `generate(..., members=...)` can evaluate these members side by side in one batch
        (e.g. low-rank noise on a backend with per-row perturbation hooks). Default: no."""
        return False

    def population(self, members: Sequence[Member]) -> contextlib.AbstractContextManager:
        """Context manager around generate calls with `members=` drawn from `members`: a backend may
        prepare per-member state (e.g. noise factors) once instead of per call. The weights are unchanged."""
        return contextlib.nullcontext()

    @abc.abstractmethod
    def apply(self, update: Update) -> None:
        """theta += alpha/G * sum_i c_i eps_i (on the fp32 master weights)."""

    @abc.abstractmethod
    def fingerprint(self) -> str:
        """A hash of the weights: equal fingerprints mean identical weights."""

    @abc.abstractmethod
    def save(self, directory: str) -> None:
        """Write a checkpoint that `AutoModelForCausalLM.from_pretrained(directory)` loads, with the ES
        optimizer's state (if any) in OPTIMIZER_FILE."""

    @abc.abstractmethod
    def master_weights(self) -> dict:
        """The fp32 weights ES works on, by tensor name (live references: do not modify)."""

    @abc.abstractmethod
    def load_master_weights(self, weights: dict) -> None:
        """Replace the weights (fp32 tensors by name), e.g. from a checkpoint or a replay."""

    def load_optimizer_state(self, state: OptimizerState) -> None:
        """Replace the ES optimizer's state (momentum / Adam moments, base weights for weight decay)."""
        if state:
            raise NotImplementedError(f"{type(self).__name__} keeps no ES optimizer state")

    def load_checkpoint(self, directory: str | os.PathLike) -> None:
        """Continue from a checkpoint written by `save`: its weights and its ES optimizer state."""
        self.load_master_weights(load_checkpoint_weights(directory))
        self.load_optimizer_state(read_optimizer_state(directory))

    def num_parameters(self) -> int:
        return sum(t.numel() for t in self.master_weights().values())


def weights_fingerprint(weights: dict) -> str:
    """The hash `Policy.fingerprint` returns: equal for equal tensors by name, whatever device holds them."""
    import hashlib

    digest = hashlib.sha256()
    for name in sorted(weights):
        digest.update(name.encode())
        digest.update(weights[name].detach().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def copy_into_master(master: dict, weights: dict) -> None:
    """Overwrite every master tensor with its namesake in `weights` (cast to fp32); all must be present."""
    missing = sorted(set(master) - set(weights))
    if missing:
        raise ValueError(f"weights lack {len(missing)} tensors, e.g. {missing[0]}")
    for name, tensor in master.items():
        tensor.copy_(weights[name].to(tensor.dtype))


def load_checkpoint_weights(directory: str | os.PathLike) -> dict:
    """The model tensors of a checkpoint directory (every model*.safetensors file)."""
    from safetensors.torch import load_file

    weights = {}
    for file in sorted(Path(directory).glob("model*.safetensors")):
        weights.update(load_file(file))
    return weights


def write_optimizer_state(directory: str | os.PathLike, state: OptimizerState) -> None:
    """Save the optimizer state into a checkpoint directory (nothing when it is empty: plain SGD)."""
    if state:
        from safetensors.torch import save_file

        save_file({k: t.contiguous() for k, t in state.state_dict().items()}, str(Path(directory) / OPTIMIZER_FILE))


def read_optimizer_state(directory: str | os.PathLike) -> OptimizerState:
    """The optimizer state of a checkpoint directory (empty when it has none)."""
    state = OptimizerState()
    file = Path(directory) / OPTIMIZER_FILE
    if file.exists():
        from safetensors.torch import load_file

        state.load_state_dict(load_file(file))
    return state
