# serwatt: two commands that work on a fresh machine: `make demo` and `make test`
# (`make check` adds the long proofs: CI runs it).
# Python 3.11 is preferred because the CPU PyTorch wheel on these machines is built for it.
PYTHON ?= $(shell command -v python3.11 || pyenv which python3.11 2>/dev/null || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
# the test tools (pytest, ruff, mypy, ...): `make test` installs them, `make demo` does not
TEST_DEPS := $(VENV)/.test-deps

.PHONY: demo test check lint system-deps clean target-venvs

$(BIN)/serwatt: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	# CPU PyTorch from the machine's local wheel: the torch codepath and the checkpoint
	# benchmark need it; serwatt itself runs without it.
	$(BIN)/pip install -q 'torch==2.13.0' || echo "torch not installed: torch tests will fail"
	touch $@

$(TEST_DEPS): $(BIN)/serwatt pyproject.toml
	$(BIN)/pip install -q -e '.[test]'
	touch $@

# Debian packages the tests use: a real Prometheus server (+ promtool), systemd-analyze,
# Chromium (headless) to open the A/B report's HTML page, and VictoriaMetrics (single
# node) as the long-term store Prometheus remote-writes into (tests/report/test_fleet.py),
# Go for `go tool pprof`, which reads `serwatt profile --pprof` (tests/profile/test_pprof.py),
# and fuse3 (libfuse3 + fusermount3) for the stalling FUSE filesystem of tests/fuse_stall.py.
system-deps:
	@command -v prometheus >/dev/null && command -v promtool >/dev/null || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null)
	@command -v systemd-analyze >/dev/null || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd >/dev/null)
	@command -v chromium >/dev/null || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null)
	@command -v victoria-metrics >/dev/null || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq victoria-metrics >/dev/null)
	@command -v go >/dev/null || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq golang-go >/dev/null)
	@command -v fusermount3 >/dev/null || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fuse3 >/dev/null)

demo: $(BIN)/serwatt
	$(BIN)/serwatt demo

# Target interpreters for the real-process classification tests: CPython 3.10 and
# 3.12 (pyenv) venvs with protobuf, msgpack, pyyaml, orjson (tests/workloads/targets.py).
target-venvs: $(TEST_DEPS)
	$(BIN)/python -m tests.workloads.targets

# Two targets, one meaning each. Where a test goes is set by its pytest markers
# (pyproject.toml; --strict-markers refuses an unknown one):
# - no marker: `make test`, what a contributor runs before every commit (under 10 minutes
#   on a 2-vCPU VM, green at load 4). Every logic test, and a few real-process tests per
#   component whose bounds hold at any load (a claim covering the truth, not a quiet
#   machine's figure).
# - `long`: `make check` only, in parallel workers. A proof that runs real jobs for long
#   (soak, full-length seccomp and allocation proofs, fleet, browser, real-job A/Bs), or a
#   second real-process test of a behaviour `make test` already covers. A new test that
#   takes over ~15 s on a quiet machine (`--durations`) is `long` unless it is the
#   component's only real-process test.
# - `serial`: `make check` only, alone after its parallel pass. The test measures time, CPU
#   shares or scheduling against a quiet machine's figure, so it means something only on a
#   quiet machine: it runs alone, and where it can it measures the load and says so.
# Workers: most tests wait on subprocesses, so more workers than CPUs pays
# (docs/benchmarks.md "Test suite").
PYTEST_WORKERS ?= 6
PYTEST := $(BIN)/python -m pytest -q --durations=15

test: $(TEST_DEPS) system-deps target-venvs lint
	@start=$$(date +%s); \
	$(PYTEST) -n $(PYTEST_WORKERS) -m "not long and not serial"; rc=$$?; \
	echo "make test: pytest wall time $$(($$(date +%s) - start)) s in $(PYTEST_WORKERS) workers"; \
	exit $$rc

# make test, then the long proofs in workers and the measuring tests alone
check: test
	@start=$$(date +%s); \
	$(PYTEST) -n $(PYTEST_WORKERS) -m "long and not serial"; parallel=$$?; \
	mid=$$(date +%s); \
	$(PYTEST) -m serial; serial=$$?; \
	end=$$(date +%s); \
	echo "make check (after make test): pytest wall time $$((end - start)) s ($$((mid - start)) s in $(PYTEST_WORKERS) workers, $$((end - mid)) s serial)"; \
	test $$parallel -eq 0 && test $$serial -eq 0

lint: $(TEST_DEPS)
	$(BIN)/ruff check profiler collectors tests bench
	$(BIN)/ruff format --check profiler collectors tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) .venv-targets .pytest_cache .mypy_cache .ruff_cache .hypothesis
