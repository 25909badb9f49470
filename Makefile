# turnpool — two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: demo test lint bench bench-quick soak soak-hostile soak-thousand soak-journal venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m examples.demo
	@# The batch runner on a file mixing every outcome; exit 1 (some jobs did not complete) is expected.
	@out=$$(mktemp -d)/results.jsonl; \
	$(BIN)/turnpool batch examples/jobs.jsonl -o $$out --workers 2 --path . --grace 1 --kill-after 1; rc=$$?; \
	echo "one JSON line per job in $$out (exit $$rc), e.g.:"; head -n 1 $$out; test $$rc -le 1

# The house habits, enforced rather than configured: ruff (lint and format, pyproject's
# [tool.ruff]) over everything, mypy --strict over the three packages ([tool.mypy]). The same
# three commands run as pre-commit hooks (.pre-commit-config.yaml).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy wire worker supervisor

test: lint
	$(BIN)/python -m pytest -n auto -q

BENCH_STAMP := $(VENV)/.bench-stamp

# The peers (pebble, loky, Celery, Ray) come from the `bench` extra; a peer that does not
# install or start is skipped by the suite with the reason printed.
$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install -q -e '.[test,bench]' || echo "some bench peers did not install: they will be skipped"
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BIN)/python -m benchmarks

bench-quick: $(BENCH_STAMP)
	$(BIN)/python -m benchmarks --quick

# The full soak (tens of thousands of turns, supervisor SIGKILL rounds, longer fuzzing):
# writes benchmarks/SOAK.md. The CI version is tests/test_soak.py.
soak: $(STAMP)
	$(BIN)/python -m tests.support.soak --turns 30000

# A thousand concurrent I/O-bound streaming turns through one daemon for 5 minutes (no event lost,
# its RSS, status() and the dashboard sampled throughout); appends to benchmarks/SOAK.md. The CI
# version is tests/test_thousand_soak.py.
soak-thousand: $(STAMP)
	$(BIN)/python -m benchmarks.soak_thousand --turns 1000 --minutes 5

# The journal under a million turns, with its default retention and without: the file's size and
# `turnpool history`'s queries; appends to benchmarks/SOAK.md. The CI version is
# tests/test_journal_retention.py.
soak-journal: $(STAMP)
	$(BIN)/python -m benchmarks.soak_journal --turns 1000000

# The hostile-neighbour soak: one daemon with a lowered fd limit under HTTP and raw TCP floods, a
# second daemon on its journal, agents that forge, wipe, fork and kill, and an ordinary client
# throughout; appends its figures to benchmarks/SOAK.md. The CI version is tests/test_hostile_soak.py.
soak-hostile: $(STAMP)
	$(BIN)/python -m tests.support.hostile_soak --duration 120

clean:
	rm -rf $(VENV) build *.egg-info
