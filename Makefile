# Two commands do all the set-up on a machine with nothing installed:
#   make demo   builds the bundled tiny zoo and runs the farm on it
#   make test   runs the test suite
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
OUT ?= build/demo

.PHONY: demo test venv clean

venv: $(VENV)/.installed

# pip's constraint file on the reference machines keeps torch on the local CPU wheel.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[cpu,dev]'
	touch $@

demo: venv
	$(BIN)/zoo-convert zoo build $(OUT)/zoo
	$(BIN)/zoo-convert run $(OUT)/zoo/manifest.parquet --db $(OUT)/results.duckdb --out $(OUT)/artifacts
	$(BIN)/zoo-convert dashboard --db $(OUT)/results.duckdb --out $(OUT)/site

test: venv
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) build
