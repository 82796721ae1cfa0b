# Two commands do all the set-up on a fresh machine:
#   make serve   create .venv, install, serve the embedded default model on 127.0.0.1
#   make test    create .venv, install the test extras, lint (make lint), run the suite on
#                PYTEST_WORKERS=2 worker processes (0: in one process), slow tests left out
#   make test-slow runs the tests marked slow (engines compiled for one check each)
#   make test-durations records per-file times (tests/durations.json): longest files run first
# `make format` applies ruff's fixes and format. And one habit (docs/mutation.md):
#   make mutation  mutate the host scheduler and the catalog, run the jax-free scheduler tests
#                  against every mutant, print the kill rate per module and the survivors
#                  (MUTATE=helios_jax/scheduler/cost.py restricts it to files or folders;
#                  SAMPLE=7 runs only the mutants whose number ends in 7, a tenth of each function's)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
PYTEST_ARGS ?=
# Test worker processes (pytest-xdist); 0 runs the suite in this process.
PYTEST_WORKERS ?= 2
XDIST = $(if $(filter-out 0,$(PYTEST_WORKERS)),-n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder)
SERVE_ARGS ?=
MUTATE ?=
SAMPLE ?=
comma := ,
# mutmut names a mutant module.function__mutmut_N: helios_jax/scheduler/cost.py -> helios_jax.scheduler.cost.*
# SAMPLE=37 appends __mutmut_*[37]: a systematic sample, every function's mutants numbered ...3 and ...7.
MUTANT_SUFFIX = $(if $(SAMPLE),__mutmut_*[$(SAMPLE)])
# What `make mutation SAMPLE=...` mutates when MUTATE is not given (pyproject's only_mutate).
MUTATED = helios_jax/scheduler/ helios_jax/catalog.py helios_jax/catalog_descriptor.py \
	helios_jax/catalog_contracts.py helios_jax/catalog_planning.py
MUTANT_GLOBS = $(foreach p,$(or $(MUTATE),$(if $(SAMPLE),$(MUTATED))),'$(subst /,.,$(patsubst %.py,%,$(patsubst %/,%,$(p)))).*$(MUTANT_SUFFIX)')

.PHONY: test test-slow test-durations lint format serve install bench mutation clean

$(VENV)/.stamp-base: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e .
	touch $@

$(VENV)/.stamp-test: $(VENV)/.stamp-base
	$(PIP) install -q -e '.[test]'
	# xgrammar (the structured extra) without its metadata's triton: the test extra brought torch
	$(PIP) install -q --no-deps xgrammar==0.2.9 'apache-tvm-ffi>=0.1.11'
	touch $@

$(VENV)/.stamp-mutation: $(VENV)/.stamp-base
	$(PIP) install -q -e '.[mutation]'
	touch $@

install: $(VENV)/.stamp-base

test: $(VENV)/.stamp-test lint
	$(PY) -m pytest -q $(XDIST) -m "not slow" $(PYTEST_ARGS)

# The tests marked slow (each compiles engines of its own: a minute or more), outside CI's budget.
test-slow: $(VENV)/.stamp-test
	$(PY) -m pytest -q $(XDIST) -m slow $(PYTEST_ARGS)

# Record per-file test times (tests/durations.json): `make test` runs the longest files first.
test-durations: $(VENV)/.stamp-test
	$(PY) -m pytest -q $(XDIST) -m "not slow" --durations=0 $(PYTEST_ARGS) | tee .test-durations.txt
	$(PY) scripts/test_durations.py .test-durations.txt

# ruff (lint and format, configured in pyproject.toml) over the tree, mypy over helios_jax/scheduler.
lint: $(VENV)/.stamp-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: $(VENV)/.stamp-test
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

serve: $(VENV)/.stamp-base
	$(PY) -m helios_jax.serve $(SERVE_ARGS)

bench: $(VENV)/.stamp-base
	$(PY) scripts/bench/scheduler_select.py

# The tests in mutants/ import helios_jax from there; mutmut copies files but not the links
# helios_jax/reference and helios_jax/kernels, so these links point the copy at this checkout's folders.
mutation: $(VENV)/.stamp-mutation
	mkdir -p mutants/helios_jax
	ln -sfn ../../reference mutants/helios_jax/reference
	ln -sfn ../../kernels mutants/helios_jax/kernels
	$(VENV)/bin/mutmut run $(MUTANT_GLOBS)
	$(PY) scripts/mutation_report.py $(if $(MUTATE),--paths=$(subst $() ,$(comma),$(strip $(MUTATE)))) $(if $(SAMPLE),--sample=$(SAMPLE))

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .jax_cache mutants
