# Set-up and the two jobs the README names. Everything installs into .venv from PyPI.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install run test gpu-test clean

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
# (each holds TVM and torch; on two cores: 8.5-11 minutes instead of 17).
test: $(STAMP)
	$(BIN)/python -m pytest -q -n auto --maxprocesses=4

# The GPU tests (on a machine with a CUDA GPU), one process per core: they share the GPU and spend most of
# their time in nvcc and in the float64 references (H100 host, 16 cores: about 6 minutes).
gpu-test: $(STAMP)
	$(BIN)/python -m pytest -q -m gpu -n auto

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
