# Agent-Reach: `make up` runs the local three-region cluster, `make test` runs the tests
# (`make test-unit`: the unit tests alone, about a minute).
# Every target installs what it needs into a local virtualenv first.

PYTHON  ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: install browser promtool up test test-unit bench bench-resolve bench-federation bench-semantic bench-routing bench-peers bench-scale bench-federation-scale bench-cli clean

install: $(STAMP)

# torch is pinned and installed first: an unpinned torch pulled in by sentence-transformers
# would be a multi-GB CUDA build, while 2.13.0 (CPU) is what these machines carry.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[semantic,embedded,dev,otel]'
	touch $(STAMP)

# make up ARGS='--any-port --demo': any option of `agent-reach up`.
up: install
	$(BIN)/agent-reach up $(TOPOLOGY) $(ARGS)

test: install browser promtool
	$(BIN)/python -m pytest -q -p no:cacheprovider

# The console's browser test (tests/http/test_console_browser.py) drives Debian's headless Chromium
# and its driver; installed here when missing (as root). Where they cannot be, the test is skipped.
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  { [ "$$(id -u)" = 0 ] && apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null; } || \
	  echo "make: chromium and chromium-driver could not be installed; the browser test will be skipped"

# The unit tests alone (no server, socket, subprocess or model): about 360 tests, some 45 s of CPU
# (collecting them takes about 9 s of it), so about a minute on a quiet machine, more under load.
test-unit: install
	$(BIN)/python -m pytest -q -p no:cacheprovider -m unit

# promtool (Debian's prometheus package) lints /metrics in tests/ops/test_metrics.py; without it (not
# root, no apt) the test lints with the same rules in Python only.
promtool:
	@command -v promtool >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
		apt-get install -y -qq --no-install-recommends prometheus >/dev/null; } || \
		echo "promtool not installed: tests/ops/test_metrics.py lints /metrics in Python only"

bench: bench-resolve bench-federation bench-semantic bench-routing bench-peers bench-scale bench-federation-scale bench-cli

# wrk drives the resolve benchmark from a separate process; it comes from Debian's packages.
bench-resolve: install
	@command -v wrk >/dev/null || (apt-get update -qq && apt-get install -y -qq wrk)
	$(BIN)/python -m bench.resolve

# The same workloads against etcd (Debian's etcd-server) in the same run.
bench-peers: install
	@command -v wrk >/dev/null || (apt-get update -qq && apt-get install -y -qq wrk)
	@command -v etcd >/dev/null || (apt-get update -qq && apt-get install -y -qq etcd-server)
	$(BIN)/python -m bench.peers
	$(BIN)/python -m bench.peers --workers 2

bench-scale: install
	@command -v wrk >/dev/null || (apt-get update -qq && apt-get install -y -qq wrk)
	$(BIN)/python -m bench.scale

bench-federation: install
	$(BIN)/python -m bench.federation

bench-semantic: install
	$(BIN)/python -m bench.semantic

bench-routing: install
	$(BIN)/python -m bench.routing

bench-cli: install
	$(BIN)/python -m bench.cli

# N regions under heartbeat load, on the commit before issue 12 (exported to a temporary directory,
# not a worktree) and on this tree; then the arithmetic of docs/SCALE.md.
FEDERATION_SCALE_BEFORE ?= fef7d88
bench-federation-scale: install
	before=$$(mktemp -d) && git archive $(FEDERATION_SCALE_BEFORE) | tar -x -C $$before && \
	$(BIN)/python -m bench.federation_scale --before-tree $$before; status=$$?; rm -rf $$before; exit $$status
	$(BIN)/python -m bench.scale_arithmetic

clean:
	rm -rf $(VENV) build *.egg-info
