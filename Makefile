# Set-up and the two jobs the README names. Everything installs into .venv from PyPI.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install run test gpu-test wheel-test ptxas-table clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# The main job: compile an LSTM to a persistent CUDA kernel, print its ptxas report and check
# the CPU reference build against NumPy; on a machine with a GPU it also runs and times the kernel.
run: $(STAMP)
	$(BIN)/prnn-tvm compile lstm --hidden 256 --batch 4 --seq 64

# The tests CI runs (GPU tests skip themselves without a GPU), one process per core, at most four
# (each holds TVM and torch; ptxas's reports from the committed table below, docs/tests.md); the tests of one
# xdist_group run in one process (they share what they build).
test: $(STAMP)
	$(BIN)/python -m pytest -q -n auto --maxprocesses=4 --dist loadgroup

# The table of ptxas's reports the tests read instead of running nvcc (docs/tests.md): written again from a run of the
# suite that compiles every kernel source and probe (bench/probes/) and records its report; commit it after a change to
# the generated code or to a probe.
PTXAS_TABLE := tests/data/ptxas-reports.jsonl
ptxas-table: $(STAMP)
	rm -f $(PTXAS_TABLE)
	PRNN_TVM_PTXAS_TABLE_RECORD=1 $(BIN)/python -m pytest -q -n auto --maxprocesses=4 --dist loadgroup
	LC_ALL=C sort -u -t'"' -k4,4 -o $(PTXAS_TABLE) $(PTXAS_TABLE)  # one line per key (field 4), by key

# The GPU tests (on a machine with a CUDA GPU), one process per core: they share the GPU and spend most of
# their time in nvcc and in the float64 references (H100 host, 16 cores: about 6 minutes).
gpu-test: $(STAMP)
	$(BIN)/python -m pytest -q -m gpu -n auto

# The package as a user gets it: build the wheel, install it into a fresh virtualenv (no system site-packages; the
# dependencies come from pip's cache) and use it from outside the repository (CI runs it after the tests).
wheel-test: $(STAMP)
	rm -rf build/wheel build/wheel-venv
	$(BIN)/python -m pip wheel -q --no-deps -w build/wheel .
	$(PYTHON) -m venv build/wheel-venv
	build/wheel-venv/bin/python -m pip install -q build/wheel/prnn_tvm-*.whl
	outside="$$(mktemp -d)" && cd "$$outside" && PRNN_TVM_CACHE_DIR="$$outside/cache" XDG_DATA_HOME="$$outside/data" \
		$(abspath build/wheel-venv/bin/python) $(abspath .ci/wheel_check.py) $(abspath build/wheel-venv/bin/prnn-tvm); \
		status=$$?; rm -rf "$$outside"; exit $$status

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
