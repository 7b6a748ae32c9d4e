# Two commands: `make run` (the main job on the shipped registry.db) and `make test` (every test).
# Both create .venv and install into it when it is missing or pyproject.toml changed: `make run` only zoo and its
# runtime dependencies; `make test` adds the test, lint and docs tools and the Debian packages the tests drive.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
RUNTIME := $(VENV)/.installed-runtime
STAMP := $(VENV)/.installed
# Wait this long for another apt or dpkg process (an unattended upgrade) to let go of its lock, instead of failing.
APT := apt-get -o DPkg::Lock::Timeout=600 -qq

.PHONY: run test lint test-fast test-timm-checks test-zoo registry bench sweep docs

$(RUNTIME): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e .
	touch $(RUNTIME)

# The browser tests (tests/test_web_browser.py) drive Debian's Chromium, and the PostgreSQL tests start
# Debian's PostgreSQL server (tests/pg.py); CI runs as root and installs both.
$(STAMP): $(RUNTIME)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[test,lint,docs,hf,postgres,web]'
	test -x /usr/bin/chromium -a -x /usr/bin/chromedriver || { if [ "$$(id -u)" = 0 ]; then \
		{ $(APT) update && $(APT) install -y chromium chromium-driver; } || { echo "make test: could not install" \
		"Debian's chromium and chromium-driver (above: why); the browser tests need them" >&2; exit 1; }; \
		else echo "not root: install chromium and chromium-driver for the browser tests"; fi; }
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { if [ "$$(id -u)" = 0 ]; then \
		{ $(APT) update && $(APT) install -y postgresql; } || { echo "make test: could not install Debian's" \
		"postgresql (above: why); the PostgreSQL tests need it" >&2; exit 1; }; \
		else echo "not root: install postgresql for the PostgreSQL tests (they are skipped without it)"; fi; }
	touch $(STAMP)

# zoo.get's time is its own: torch, timm (the model's library) and zoo are imported first, timed apart.
run: $(RUNTIME)
	$(BIN)/zoo search "params<1e8 and name~'vit_*' and kind=architecture" --sort -params --limit 10
	$(BIN)/zoo search "top1>85 and params<30M" --sort -top1 --limit 5
	$(BIN)/zoo show timm/resnet50
	$(BIN)/python -c "import time; t0 = time.perf_counter(); import torch, timm, zoo; t1 = time.perf_counter(); \
	m = zoo.get('timm/vit_large_patch16_224'); t2 = time.perf_counter(); \
	print(f'zoo.get: {type(m).__module__}.{type(m).__name__}, {sum(p.numel() for p in m.parameters()):,} params, ' \
	f'devices {sorted({str(p.device) for p in m.parameters()})}, {t2 - t1:.2f} s (importing torch, timm and zoo before ' \
	f'it: {t1 - t0:.2f} s)')"

# Test processes (pytest-xdist), each taking whole files (module fixtures are built once). Most tests keep one core
# busy at a time (a CLI's imports, a meta build): two processes on CI's two cores take 15 minutes instead of 23.
WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -q -n $(WORKERS) --dist loadfile

# Lint first: a formatting slip or a type error fails in seconds, not after the suite.
test: lint
	$(PYTEST)

# ruff (lint and format, pyproject.toml) and mypy over zoo/; pre-commit runs the same (.pre-commit-config.yaml).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The first check on every change, in under 5 minutes on 2 cores: everything but the whole-zoo and long checks (slow,
# timm_checks, sweep) and the tests of a real component they start (browser: Chromium; postgres: the PostgreSQL
# server; distributed: torch.distributed ranks as processes). tests/conftest.py sets those three markers.
test-fast: $(STAMP)
	$(PYTEST) -m "not slow and not sweep and not whole_zoo and not timm_checks and not browser and not postgres and not distributed"

# timm's model checks on every architecture of tests/test_timm_checks.py alone (make test runs them too); about 5 min.
test-timm-checks: $(STAMP)
	$(BIN)/python -m pytest -q tests/test_timm_checks.py

# Every timm and torchvision model and variant of the shipped registry against a plain build of the installed
# libraries (tests/test_whole_zoo.py); about 11 minutes on 2 cores. make test checks a sample of them.
test-zoo: $(STAMP)
	$(BIN)/python -m pytest -q -m whole_zoo tests/test_whole_zoo.py

# Every model through materialize (round trip and init); 1-2 hours, see tests/test_zoo_sweep.py; results in sweep-results.json.
sweep: $(STAMP)
	$(BIN)/python -m pytest -q -s -m sweep tests/test_zoo_sweep.py

# Rebuild the shipped registry: unchanged models are skipped, so only what changed is rebuilt. `installed`: every
# timm and torchvision architecture and a row per pretrained variant (timm tag, torchvision weights enum) with its
# published metadata; timm's published validation results are read from catalog/timm-results (see its README).
# The last step, `db compact`, also turns the file back to a rollback journal from the WAL its writers use: read
# that way it needs nothing beside it (no -shm), so it reads on a read-only mount and as a user who does not own it.
registry: $(STAMP)
	$(BIN)/zoo --registry registry.db db upgrade
	$(BIN)/zoo --registry registry.db index installed --results catalog/timm-results -j 2
	$(BIN)/zoo --registry registry.db index hf catalog/hf/*__*.json
	$(BIN)/zoo --registry registry.db db compact
	$(MAKE) test-zoo

# Every script runs, whatever one before it did (materialize_cuda.py exits 2 without a GPU); the target fails
# at the end, naming the scripts that failed.
bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[bench]'
	failed=""; for script in bench/*.py; do $(BIN)/python $$script || failed="$$failed $$script"; done; \
	if [ -n "$$failed" ]; then echo "bench scripts that failed:$$failed"; exit 1; fi

# The documentation site (docs/, mkdocs.yml) into build/site: --strict fails on a broken link or an API reference that
# does not resolve. docs/gen_reference.py writes its generated pages (tests/test_docs.py checks they are current).
docs: $(STAMP)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[docs]'
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict
