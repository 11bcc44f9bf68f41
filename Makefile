# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
# torch is installed first, pinned, so no other package pulls a (CUDA) torch.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0
STAMP := $(VENV)/.installed-$(TORCH_VERSION)

.PHONY: install demo test test-slow test-gpu clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install --quiet torch==$(TORCH_VERSION)
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# Build the zoo MLP for the CPU, validate it, inspect it and run it from an .npz.
demo: install
	mkdir -p build
	$(VENV)/bin/exporter build zoo:mlp --target cpu --out build/mlp-cpu.artifact
	$(VENV)/bin/exporter inspect build/mlp-cpu.artifact
	$(PY) -c "import numpy as np; np.savez('build/mlp-inputs.npz', x=np.random.default_rng(0).standard_normal((4, 64), dtype=np.float32))"
	$(VENV)/bin/exporter run build/mlp-cpu.artifact --inputs build/mlp-inputs.npz --out build/mlp-outputs.npz

test: install
	$(PY) -m pytest -m "not slow and not cuda"

test-slow: install
	$(PY) -m pytest -m "slow and not cuda"

# On the GPU machine (torch preinstalled there): runs the CUDA-marked tests.
test-gpu:
	$(PYTHON) -m pytest -m cuda

clean:
	rm -rf build .pytest_cache
