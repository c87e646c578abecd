PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# onnxruntime's C API header for the custom-operator library (tools/ort_headers.sh: a private
# download of Debian's libonnxruntime-dev; without network the project works without it)
ORT_HEADERS := .cache/ort-headers/.tried

# The suite runs in 2 xdist workers: each gets half the cores for torch, OpenMP (our kernels)
# and BLAS, so the two never run more threads than there are cores (oversubscribed OpenMP
# threads wait on each other; on 2 cores that multiplied some torch calls' times many-fold)
WORKER_THREADS := $(shell n=$$(nproc 2>/dev/null || echo 2); t=$$((n / 2)); [ $$t -ge 1 ] && echo $$t || echo 1)
TEST_THREADS := OMP_NUM_THREADS=$(WORKER_THREADS) MKL_NUM_THREADS=$(WORKER_THREADS) OPENBLAS_NUM_THREADS=$(WORKER_THREADS)

.PHONY: venv demo test lint bench clean

$(STAMP): pyproject.toml tools/sysdeps.sh
	sh tools/sysdeps.sh
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[dev,bench]'
	touch $(STAMP)

$(ORT_HEADERS): tools/ort_headers.sh
	sh tools/ort_headers.sh .cache/ort-headers
	mkdir -p .cache/ort-headers && touch $(ORT_HEADERS)

venv: $(STAMP) $(ORT_HEADERS)

demo: $(STAMP) $(ORT_HEADERS)
	$(BIN)/graph-autofusion demo

test: $(STAMP) $(ORT_HEADERS)
	sh tools/chromium.sh >/dev/null || echo "no headless Chromium: the HTML report's browser test is skipped" >&2
	$(TEST_THREADS) $(BIN)/python -m pytest -q -n 2 --dist loadgroup --durations=25

lint: $(STAMP)
	$(BIN)/ruff check graph_autofusion tests benchmarks
	$(BIN)/ruff format --check graph_autofusion tests benchmarks

clean:
	rm -rf $(VENV) .cache
