# The two commands of the README: `make run` and `make test`. Both create .venv and
# install everything on first use; nothing has to be installed by hand.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
# Extra pytest arguments, e.g. `make test PYTEST_ARGS="-m slow"`.
PYTEST_ARGS ?=
# Test workers (pytest-xdist), each taking whole test files, so a file's fixtures are made once:
# 2 fills this project's 2-core machines (the suite in 13 min against 20 in one process); 0: one process.
TEST_WORKERS ?= 2

.PHONY: install run test bench wheel clean

# Ranges live in pyproject.toml; the exact versions of this project's machines in CONSTRAINTS.
CONSTRAINTS := constraints/cpu.txt
PIP := $(PY) -m pip install --quiet -c $(CONSTRAINTS)

$(STAMP): pyproject.toml $(CONSTRAINTS) Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip setuptools
	# torch first, alone: its pin (the CPU wheel on disk) is in place before anything asks for torch.
	$(PIP) torch
	# faiss-cpu for `cf --topk faiss` and face identification; the test extra brings the ONNX packages.
	# torchrec-cpu: torchrec's run-time dependencies with the CPU fbgemm (fbgemm-gpu-cpu)...
	$(PIP) --no-build-isolation -e '.[test,faiss,torchrec-cpu]'
	# ...then torchrec itself without its metadata's CUDA fbgemm-gpu.
	$(PIP) --no-deps torchrec
	touch $(STAMP)

install: $(STAMP)

# The main job: DLRM through the embedding cache on built-in synthetic Criteo-shaped data.
# Run again, it continues the run in runs/dlrm (--resume; a finished one just reports);
# `make run RUN_ARGS=--overwrite` starts over.
RUN_DIR  ?= runs/dlrm
RUN_ARGS ?= $(if $(wildcard $(RUN_DIR)/dlrm-last.pt $(RUN_DIR)/last.pt),--resume)
run: install
	$(VENV)/bin/embcache dlrm train --checkpoint-dir $(RUN_DIR) --metrics-out $(RUN_DIR)/metrics.jsonl $(RUN_ARGS)

test: install
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# Every benchmark at its settings in docs/benchmarks.md; results land in bench/results/.
bench: install
	$(VENV)/bin/embcache bench cache --batches 600 --parts hit-rate
	$(VENV)/bin/embcache bench cache --parts timing --timing-steps 60 --name cache_timing
	$(VENV)/bin/embcache bench host
	$(VENV)/bin/embcache bench dlrm
	$(VENV)/bin/embcache bench cf --wide-dim 128
	$(VENV)/bin/embcache bench face
	$(VENV)/bin/embcache bench scaling
	$(VENV)/bin/embcache bench vocab

# The package as a wheel in dist/, what a GPU machine's check installs (bench/device_check.sh). From a
# clean build folder: setuptools reuses build/lib, and a module moved or removed since would ride along.
wheel: install
	rm -rf build dist
	$(PY) -m pip wheel --quiet --no-deps --no-build-isolation -w dist .

clean:
	rm -rf $(VENV) build dist *.egg-info
