# Two entry points on a fresh clone: `make demo` and `make test`.
# Both create .venv if missing and install nndx into it.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.nndx-installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $@

demo: $(STAMP)
	$(BIN)/nndx demo

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# DIAGNOSIS_ARGS goes to bench/diagnosis.py only (e.g. DIAGNOSIS_ARGS=--quick, or --jobs 4)
bench: $(STAMP)
	for b in bench/*.py; do echo "== $$b"; args=""; if [ "$$b" = bench/diagnosis.py ]; then args="$(DIAGNOSIS_ARGS)"; fi; \
		$(BIN)/python $$b $$args || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info
