# Two entry points on a fresh clone: `make demo` and `make test`.
# Both create .venv if missing. `make demo` installs the library alone (torch, then nndx
# with no extra); `make test` adds the test extra (Lightning, transformers, W&B,
# schemathesis...), which only the tests use. Each install has its own stamp, so a demo
# never pays for the test extra and a test run never reinstalls the library.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
# --no-compile: no bytecode for every file of every package at install time (most of
# torch's install CPU time); Python compiles what it imports, once, on first use
PIP_INSTALL := $(BIN)/python -m pip install -q --no-compile
LIBRARY_STAMP := $(VENV)/.nndx-library
TEST_STAMP := $(VENV)/.nndx-test

.PHONY: demo test bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(LIBRARY_STAMP): pyproject.toml | $(BIN)/python
	$(PIP_INSTALL) "$(TORCH_SPEC)"
	$(PIP_INSTALL) -e .
	touch $@

$(TEST_STAMP): $(LIBRARY_STAMP)
	$(PIP_INSTALL) -e ".[test]"
	touch $@

demo: $(LIBRARY_STAMP)
	$(BIN)/nndx demo

test: $(TEST_STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# DIAGNOSIS_ARGS goes to bench/diagnosis.py only (e.g. DIAGNOSIS_ARGS=--quick, or --jobs 4)
bench: $(TEST_STAMP)
	for b in bench/*.py; do echo "== $$b"; args=""; if [ "$$b" = bench/diagnosis.py ]; then args="$(DIAGNOSIS_ARGS)"; fi; \
		$(BIN)/python $$b $$args || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info
