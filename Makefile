PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv demo test lint bench clean

$(STAMP): pyproject.toml tools/sysdeps.sh
	sh tools/sysdeps.sh
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/graph-autofusion demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup

lint: $(STAMP)
	$(BIN)/ruff check graph_autofusion tests benchmarks
	$(BIN)/ruff format --check graph_autofusion tests benchmarks

clean:
	rm -rf $(VENV) .cache
