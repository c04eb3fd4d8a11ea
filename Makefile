PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# What the demo needs: the package and its runtime dependencies, none of the dev tools, the
# integrations' trainers or the mirrors' trackers (make venv installs those too, and marks
# this done as well).
DEMO_STAMP := $(VENV)/.installed-demo

.PHONY: test check lint venv clean demo bench cuda-check lowest torch-lanes wheel-check

venv: $(STAMP)

# The package as users import it, by its one name: setuptools' strict editable mode lays a
# tree of links named as the wheel names them (build/__editable__.*/scalewatch/...), so the
# tests, mypy and the demo see ``scalewatch`` and nothing else. A file added or removed in a
# package folder (its mtime) lays the links again.
EDITABLE := --config-settings editable_mode=strict
PACKAGE_DIRS := $(shell find scaler app migrations web -type d -not -name __pycache__ \
	-not -path 'web/tests*' 2>/dev/null)
LINKS := $(VENV)/.links

$(STAMP): pyproject.toml setup.py constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -c constraints.txt $(EDITABLE) -e '.[dev,integrations,tensorboard,mlflow,wandb]'
	touch $(STAMP) $(DEMO_STAMP) $(LINKS)

$(DEMO_STAMP): pyproject.toml setup.py constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -c constraints.txt $(EDITABLE) -e .
	touch $(DEMO_STAMP) $(LINKS)

$(LINKS): $(PACKAGE_DIRS)
	$(BIN)/python -m pip install --quiet --no-deps $(EDITABLE) -e .
	touch $(LINKS)

# The suite on $(JOBS) xdist workers: most of its time is spent waiting on subprocesses (ranks,
# servers, trainers), so more workers than cores pay. A group (the browser tests, which share
# one Chromium) runs on one worker; a test marked alone runs after, by itself. The dashboard's
# pure functions first (Node's own runner).
JOBS ?= 3
XDIST := -n $(JOBS) --dist loadgroup

test: $(STAMP) $(LINKS)
	node --test web/tests/
	$(BIN)/python -m pytest -q --durations=30 $(XDIST) -m "not alone"
	$(BIN)/python -m pytest -q -m alone

# Before a commit (about a minute): lint, then every test but the slow and heavy ones (real
# ranks, trainers, servers, fuzzing), Chromium's and PostgreSQL's, stopping at the first failure.
check: $(STAMP) $(LINKS)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q $(XDIST) -x -m "not slow and not heavy and not browser and not postgres"

lint: $(STAMP) $(LINKS)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The service and the store against the lowest release of each runtime dependency that
# pyproject.toml admits (constraints-lowest.txt), in a venv of their own that finds torch
# and the test tools in $(VENV) behind them; and the charts drawn in Chromium with that plotly;
# then the mirrors against each tracker extra's lowest release (constraints-lowest-trackers.txt).
LOWEST := .venv-lowest
PURELIB := import sysconfig; print(sysconfig.get_paths()["purelib"])

lowest: $(STAMP) $(LINKS)
	rm -rf $(LOWEST)
	$(PYTHON) -m venv $(LOWEST)
	$(LOWEST)/bin/python -m pip install --quiet -r constraints-lowest.txt
	echo "import site; site.addsitedir('$$($(BIN)/python -c '$(PURELIB)')')" \
		> "$$($(LOWEST)/bin/python -c '$(PURELIB)')/zz_scalewatch_venv.pth"
	$(LOWEST)/bin/python -m pytest -q -p no:cacheprovider -m "not slow" tests/app tests/store \
		tests/test_dependencies.py tests/reliability/test_hostile.py tests/web/test_browser_plotly.py
	# Then the trackers' lowest releases (which hold protobuf under 5 and packaging under 24),
	# the mirrors' records read back with them. wandb 0.17 leaves its service's socket open
	# at teardown (closed by later releases): its unraisable warning is not ours to fail on.
	$(LOWEST)/bin/python -m pip install --quiet -r constraints-lowest-trackers.txt
	$(LOWEST)/bin/python -m pytest -q -p no:cacheprovider -p no:unraisableexception tests/mirrors

# The distribution as users install it: the sdist and the wheel built from the tracked tree,
# the wheel installed (not editable) into a fresh venv beside torch as pinned, then trained,
# migrated and served from outside the checkout (tests/test_wheel.py; a few minutes).
wheel-check: $(STAMP) $(LINKS)
	$(BIN)/python -m pytest -q -p no:cacheprovider --wheel tests/test_wheel.py

# The scaler beside torch's own class on the oldest and the newest torch pyproject admits,
# each in a cached venv of its own (.ci/torch-lane says what it runs).
TORCH_LANES := 2.4.1 2.15.0

torch-lanes:
	for version in $(TORCH_LANES); do .ci/torch-lane $$version || exit 1; done

clean:
	rm -rf $(VENV) $(LOWEST) build *.egg-info

demo: $(DEMO_STAMP) $(LINKS)
	$(BIN)/scalewatch demo

bench: $(STAMP)
	$(BIN)/python bench/run_all.py $(ONLY)

cuda-check: $(STAMP) $(LINKS)
	bash bench/cuda_check.sh
