# Two commands do all the set-up on a machine with nothing installed:
#   make demo   builds the bundled tiny zoo and runs the farm on it
#   make test   type-checks the package (mypy, strict) and runs the whole test suite, on every CPU
#   make test-fast   the inner loop: the tests not marked slow, no type check
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
OUT ?= build/demo

.PHONY: demo test test-fast venv clean chromium node-deps bench

venv: $(VENV)/.installed

# pip's constraint file on the reference machines caps torch at 2.14.1 and torchvision at 0.29.1, the
# pair pyproject pins (both on local disk there).
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[cpu,openvino,dev]'
	touch $@

# The demo checks every variant on ort-cpu, openvino and (where node is) transformers.js: see docs/targets.md.
demo: venv $(if $(shell command -v node),node-deps)
	$(BIN)/zoo-convert zoo build $(OUT)/zoo
	$(BIN)/zoo-convert run $(OUT)/zoo/manifest.parquet --db $(OUT)/results.duckdb --out $(OUT)/artifacts
	$(BIN)/zoo-convert dashboard --db $(OUT)/results.duckdb --out $(OUT)/site

# The dashboard tests drive Debian's headless chromium; a fresh CI machine has none.
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
chromium:
	@command -v chromium >/dev/null || { $(SUDO) apt-get update -q && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; }

# The transformers.js tests run the real library in node. Debian's nodejs where the machine has no
# node; then `npm ci` installs exactly tests/js/package-lock.json (transformers.js pinned) from npm's
# cache when it can. --ignore-scripts: onnxruntime-node's npm tarball already holds its CPU binaries,
# its postinstall would only download optional GPU ones.
JS := tests/js
node-deps: $(JS)/node_modules/.installed
$(JS)/node_modules/.installed: $(JS)/package.json $(JS)/package-lock.json
	@command -v npm >/dev/null || { $(SUDO) apt-get update -q && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q nodejs npm; }
	cd $(JS) && npm ci --ignore-scripts --prefer-offline --no-audit --no-fund --loglevel=error
	touch $@

# Two passes, both run whatever the first gives: the tests marked `alone` (a time bound, pacing against a clock,
# pinned CPUs) one at a time after the rest; the rest on every CPU (at most 4 workers), each test file, or folder of
# shared fixtures, on one worker (tests/conftest.py). One test at a time kept one of CI's two CPUs idle half the run.
TEST_WORKERS ?= $(shell n=$$(nproc); echo $$(( n < 4 ? n : 4 )))
test: venv chromium node-deps
	$(BIN)/mypy
	@status=0; \
	  $(BIN)/python -m pytest -m "not alone" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder || status=1; \
	  $(BIN)/python -m pytest -m alone || status=1; \
	  exit $$status

# Well under a minute: no full-zoo run, no Ray cluster, no node or Chromium, no real-size model.
test-fast: venv
	$(BIN)/python -m pytest -m "not slow"

# Each benchmark prints its verdict last; all of them run even when one misses its target.
BENCHES := bench_manifest bench_isolation bench_rerun bench_cluster bench_minilm bench_driver_memory bench_dashboard bench_zoo bench_verify_shapes bench_targets
bench: venv
	@status=0; for b in $(BENCHES); do echo "== $$b"; $(BIN)/python benchmarks/$$b.py || status=1; done; exit $$status

clean:
	rm -rf $(VENV) build $(JS)/node_modules
