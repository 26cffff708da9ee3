# Two commands do everything on a fresh machine: `make demo` and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
DEVSTAMP := $(VENV)/.installed-dev

.PHONY: demo test lint docs dist bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

$(DEVSTAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/pip install -q --no-deps nvidia-cutlass==4.2.0.0
	# torchtitan's own model classes for tests/program/test_torchtitan.py: its dependencies would replace
	# torch 2.13 (--no-deps); it imports triton and tyro
	$(BIN)/pip install -q --no-deps torchtitan==0.3.0 spmd_types==0.3.1 tyro==1.0.17 docstring_parser==0.18.0 \
		shtab==1.13.0 typeguard==4.6.1 triton==3.9.0
	touch $@ $(STAMP)

demo: $(STAMP)
	$(BIN)/shardlayout demo

# two workers: the suite is mostly one-thread Python, and this machine has two cores
test: $(DEVSTAMP)
	$(BIN)/python -m pytest -n 2 --dist worksteal src tests README.md docs --doctest-glob='*.md'

# the site (docs/ + API reference from docstrings) into site/; strict: a warning fails the build
docs: $(DEVSTAMP)
	$(BIN)/python -m mkdocs build --strict

# the wheel and the sdist into dist/
dist: $(DEVSTAMP)
	$(BIN)/python -m build --no-isolation --outdir dist .

lint: $(DEVSTAMP)
	$(BIN)/ruff check src tests benchmarks

# every benchmark (each times ours and its peer in one run), then the docs' tables from their output
BENCHES := layout view strategy plan verify run auto stream train
bench: $(DEVSTAMP)
	for b in $(BENCHES); do $(BIN)/python benchmarks/bench_$$b.py || exit 1; done
	$(BIN)/python benchmarks/update_readme.py

clean:
	rm -rf $(VENV) build dist site *.egg-info src/*.egg-info .pytest_cache .hypothesis
