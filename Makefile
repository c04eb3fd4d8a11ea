PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test lint venv clean demo bench cuda-check

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev,integrations]'
	touch $(STAMP)

# The dashboard's pure functions first (Node's own runner, no packages): seconds, no browser.
test: $(STAMP)
	node --test web/tests/
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) build *.egg-info

demo: $(STAMP)
	$(BIN)/scalewatch demo

bench: $(STAMP)
	$(BIN)/python bench/run_all.py

cuda-check: $(STAMP)
	bash bench/cuda_check.sh
