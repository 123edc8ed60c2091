# Two commands do everything on a fresh machine (Python 3.11, no GPU needed):
#   make demo   - a real model split across backends: report, correctness, speed
#   make test   - the test suite
# Each creates .venv and installs what it needs. torch is pinned first so that pip takes
# the CPU wheel on disk instead of pulling CUDA packages.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# tensorrt-build (TensorRT for RTX: engine builds, no GPU needed; 220 MB) and triton (its
# kernels in the interpreter; 1 GB) let their tests run instead of skipping;
# `make test EXTRAS=all,test` leaves them out.
EXTRAS ?= all,test,tensorrt-build,triton

.PHONY: demo test bench zoo clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[$(EXTRAS)]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/arbiter demo

# two pytest workers (pytest-xdist): the suite is mostly Python (tracing, exporting,
# compiling), which one process runs on one core at a time
test: $(STAMP)
	$(PY) -m pytest -q -n 2

bench: $(STAMP)
	$(PY) bench/partition_scaling.py
	$(PY) bench/stitch_overhead.py

# the model zoo against every single backend (~35 min on 2 cores) -> bench/RESULTS.md
zoo: $(STAMP)
	$(PY) bench/zoo.py

clean:
	rm -rf $(VENV) build *.egg-info
