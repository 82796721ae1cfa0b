# Two commands do all the set-up on a fresh machine:
#   make serve   create .venv, install, serve the embedded default model on 127.0.0.1
#   make test    create .venv, install the test extras, run the suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
PYTEST_ARGS ?=
SERVE_ARGS ?=

.PHONY: test serve install bench clean

$(VENV)/.stamp-base: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e .
	touch $@

$(VENV)/.stamp-test: $(VENV)/.stamp-base
	$(PIP) install -q -e '.[test]'
	touch $@

install: $(VENV)/.stamp-base

test: $(VENV)/.stamp-test
	$(PY) -m pytest -q $(PYTEST_ARGS)

serve: $(VENV)/.stamp-base
	$(PY) -m helios_jax.serve $(SERVE_ARGS)

bench: $(VENV)/.stamp-base
	$(PY) scripts/bench/scheduler_select.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .jax_cache
