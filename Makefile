# pylease: `make test` is the whole check (lint, types, tests on a real PostgreSQL).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: test deps lint typecheck docs pytest venv bench demo clean generate generate-check \
	model-check model-check-deep soak

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	@# A venv made before the rename holds the same package as distribution "pylease".
	$(BIN)/pip uninstall --quiet --yes pylease 2>/dev/null || true
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

lint: venv generate-check
	$(BIN)/ruff check pylease tests scripts tools
	$(BIN)/ruff format --check pylease tests scripts tools

# The sync lease modules are generated from their async sources (tools/async_to_sync.py):
# `make generate` rewrites them, `make generate-check` fails on a stale or hand-edited one.
generate: venv
	$(BIN)/python tools/async_to_sync.py

generate-check: venv
	$(BIN)/python tools/async_to_sync.py --check

# With the typed samples of the public API (tests/support/typed_*.py): under --strict an
# unneeded `type: ignore` is an error, so a signature that lost its types fails as surely
# as one that broke. One run, so that what they share is analysed once.
typecheck: venv
	$(BIN)/mypy --strict pylease tests/support/typed_targets.py tests/support/typed_exclusive.py

# pytest runs in parallel workers (pytest-xdist): the suite mostly waits (on the server,
# on the processes it starts, on timers), so more workers than cores pay. Each test has
# its own databases, ports and files; a module whose fixture is a whole cluster or server
# is one xdist_group, run by one worker (--dist loadgroup). PYTEST_WORKERS=0 runs in this
# process, e.g. `make pytest PYTEST_WORKERS=0 PYTEST_ARGS='tests/api -x --pdb'`.
PYTEST_WORKERS ?= 6

# pytest exits 5 when it collected no test: a run that tested nothing is a failure here,
# never a silent pass (a broken conftest or testpaths must not look green).
pytest: venv
	@rc=0; $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make: pytest collected no tests (exit 5)" >&2; exit 1; fi; \
	exit $$rc

# What the suite needs beyond the venv (PgBouncer, Node.js, faketime, a running
# PostgreSQL): installed when root, else one line saying the command to run.
deps:
	@scripts/test-deps.sh

# The documentation site, built as strictly as CI would (a broken link fails); its
# examples are run by tests/docs/test_docs.py. mkdocs -q would also hide the warning count.
docs: venv
	@out=$$(NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir build/site 2>&1) \
	|| { echo "$$out" >&2; exit 1; }

# The protocol's model (model/, docs/model.md), checked exhaustively with SPIN: the
# decision table, every configuration, and every seeded bug caught. Needs only spin and
# a C compiler (scripts/test-deps.sh installs spin), not the venv.
model-check:
	@model/check.sh

model-check-deep:
	@model/check.sh deep

# `make soak`: the permits witness and the readers and writers witness under SIGKILL and
# black holes, round after round, until SOAK_GRANTS grants each were judged (a few
# minutes each; not part of `make test`).
SOAK_GRANTS ?= 2000
soak: venv
	PYLEASE_SOAK_GRANTS=$(SOAK_GRANTS) $(BIN)/python -m pytest -q -s -p no:cacheprovider \
		tests/soak

# pytest in the foreground, model-check, lint, typecheck and docs beside it, each
# check's output after pytest's, then a line per check (scripts/test-all.sh).
test: deps venv
	@MAKE='$(MAKE)' scripts/test-all.sh

# `make demo`: two runs of one lease at once on the embedded SQLite default (no
# configuration): one runs its command, the other finds the lease busy and skips.
DEMO_RUN = $(BIN)/pylease run demo-report --ttl 10s -- \
	sh -c 'echo "  $$0: running under lease $$PYLEASE_NAME, fence $$PYLEASE_FENCE"; sleep 3; echo "  $$0: done"'

demo: venv
	@echo "== two 'pylease run demo-report --ttl 10s -- <3s job>' at once, on the embedded SQLite default"
	@unset PYLEASE_DSN DATABASE_URL; \
	$(DEMO_RUN) A & a=$$!; $(DEMO_RUN) B & b=$$!; \
	wait $$a; ra=$$?; wait $$b; rb=$$?; \
	echo "== exit codes: A=$$ra B=$$rb (0: ran; 1: busy, skipped)"; \
	echo "== pylease status demo-report"; $(BIN)/pylease status demo-report; \
	test $$((ra + rb)) -eq 1

# `make bench`: pylease against its floors and its peers, side by side (benchmarks/,
# issue 6). Drops, creates and migrates the throwaway database pylease_bench, then
# writes benchmarks/results/latest.{json,md} and throughput.png, and docs/performance.md
# from them (scripts/performance_page.py); under 5 minutes.
BENCH_DSN   ?= postgresql://postgres@127.0.0.1:5432/pylease_bench
BENCH_STAMP := $(VENV)/.installed-bench

$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(BIN)/pip install --quiet -e '.[bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BIN)/python -m benchmarks --fresh --dsn '$(BENCH_DSN)' $(BENCH_ARGS)
	$(BIN)/python scripts/performance_page.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache dist build

# `make dist`: the sdist and the wheel in dist/, checked (scripts/check_dist.py): their
# metadata, `twine check`, and a fresh venv, its dependencies from the package index, that
# installs the wheel and runs `pylease --version`, `pylease migrate` against throwaway
# SQLite and PostgreSQL databases, and the README's quick start. DIST_PYTHONS: the
# interpreters to install it with (default: the venv's), e.g. "python3.11 python3.13".
.PHONY: dist
DIST_STAMP := $(VENV)/.installed-dist
DIST_PYTHONS ?=

$(DIST_STAMP): $(STAMP) pyproject.toml
	$(BIN)/pip install --quiet -e '.[dist]'
	touch $(DIST_STAMP)

dist: $(DIST_STAMP)
	rm -rf dist
	$(BIN)/python -m build --no-isolation --outdir dist .
	$(BIN)/twine check --strict dist/*
	$(BIN)/python scripts/check_dist.py dist $(foreach p,$(DIST_PYTHONS),--python $(p))
