# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
# torch is installed first, pinned, so no other package pulls a (CUDA) torch.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0
EXECUTORCH_VERSION ?= 1.5.1
# pytest-xdist workers: most tests wait on one-threaded export/compile subprocesses, so two
# workers on two cores halve the wall time; files stay whole on a worker (--dist loadfile)
TEST_WORKERS ?= 2
# Inductor compiles in the build's own process: its default pool of two starts a worker
# process that imports torch again (zoo:mlp on cpu, cold cache: 44.4 -> 39.9 CPU s, twice).
# (OMP_NUM_THREADS=1 per worker was tried in session 63: the quiet clean-clone run showed
# no gain, so torch's and ORT's pools keep their default; bench/RESULTS.md.)
# uv compiles no bytecode at install: Python writes it on first import, where
# PYTHONDONTWRITEBYTECODE (this box sets it) does not forbid it, so make's commands unset it
# (only the modules in use get compiled: about a third of site-packages; docs/testing.md).
RUN := env -u PYTHONDONTWRITEBYTECODE
TEST_ENV := $(RUN) TORCHINDUCTOR_COMPILE_THREADS=1
# this checkout, editable, built with the venv's setuptools (installed with torch): an
# isolated build environment downloads setuptools again for each install (15 s)
EDITABLE := --no-build-isolation -e
CORE_STAMP := $(VENV)/.installed-core-$(TORCH_VERSION)
STAMP := $(VENV)/.installed-$(TORCH_VERSION)

.PHONY: install browser native-deps demo test test-slow test-gpu coverage coverage-gpu bench-llm clean

# uv where it can be had (on PATH, or fetched once into build/uv), pip otherwise
# (INSTALLER=pip): tools/venv_install.py. uv installs the same packages from the sources
# pip is configured with: `make install` 20 s instead of 3 minutes with its cache warm.
INSTALL := $(PYTHON) tools/venv_install.py

$(PY):
	$(INSTALL) venv $(VENV)

# What a user needs for the cpu target (make demo): torch and the project's own
# dependencies. The tests add the dev extra: ONNX Runtime, TVM, torchao, transformers...
$(CORE_STAMP): $(PY) pyproject.toml
	@echo "installing torch $(TORCH_VERSION) (seconds with uv, about 1 minute with pip)"
	$(INSTALL) pip $(VENV) torch==$(TORCH_VERSION) "setuptools>=68"
	@echo "installing edge-exporter and its dependencies (typer, rich, pydantic, ...)"
	$(INSTALL) pip $(VENV) $(EDITABLE) .
	touch $(CORE_STAMP)

$(STAMP): $(CORE_STAMP)
	@echo "installing the dev extra: pytest, transformers, onnxruntime, apache-tvm, torchao, ray (2-3 minutes with pip)"
	# ExecuTorch without its declared extras (coremltools, pandas...: never imported here)
	$(INSTALL) pip $(VENV) --quiet --no-deps executorch==$(EXECUTORCH_VERSION)
	$(INSTALL) pip $(VENV) --quiet $(EDITABLE) '.[dev,executorch-deps]'
	touch $(STAMP)

install: $(STAMP)

# Debian's Chromium, for the browser test of `exporter report --html` (Playwright drives
# it from the dev extra; nothing downloads a browser). Needs root and apt-get; elsewhere
# that one test is skipped and says why.
browser:
	@command -v chromium >/dev/null || { \
	  if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	    echo "installing chromium (apt-get)"; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1 || { \
	      apt-get update -q >/dev/null 2>&1 && \
	      DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1; } || \
	      echo "note: apt-get could not install chromium"; \
	  else echo "note: no chromium here: the browser test of exporter report will skip"; fi; }

# The native runtime (native/, C++ with CMake) and aarch64: Debian's minizip (zlib's zip
# library, no crypto), nlohmann-json and libsodium (for this machine and as arm64 multiarch
# packages), the aarch64 cross compiler, qemu-user and ccache (the runners of each
# platform share their core objects); and the aarch64 wheels of ExecuTorch
# and TVM, unpacked as files (their runtime libraries and headers), never installed. Needs
# root and apt-get; where dpkg has them all, no apt-get at all (its update: 10-20 s).
NATIVE_APT := cmake ccache libminizip-dev nlohmann-json3-dev libsodium-dev \
  gcc-aarch64-linux-gnu g++-aarch64-linux-gnu qemu-user \
  libminizip-dev:arm64 libsodium-dev:arm64 libstdc++6:arm64
AARCH64_WHEELS := build/wheels/linux-aarch64
# named after the package set too: a checkout made before a change installs the new ones
NATIVE_STAMP := build/.native-deps-$(EXECUTORCH_VERSION)-minizip-ccache

$(NATIVE_STAMP): $(STAMP)
	@if st=$$(dpkg-query -W -f='$${db:Status-Abbrev}\n' $(NATIVE_APT) 2>/dev/null) && \
	    ! printf '%s\n' "$$st" | grep -qv '^ii'; then \
	  echo "the native toolchain is installed (dpkg-query)"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing the native toolchain (apt-get: cmake, ccache, minizip, libsodium, aarch64 cross compiler, qemu-user)"; \
	  dpkg --add-architecture arm64 && apt-get update -q >/dev/null && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(NATIVE_APT) >/dev/null; \
	else echo "note: not root or no apt-get: the native runtime needs: $(NATIVE_APT)"; fi
	$(INSTALL) unpack $(VENV) $(AARCH64_WHEELS) manylinux_2_28_aarch64 3.11 \
	  executorch==$(EXECUTORCH_VERSION) "apache-tvm==$$($(PY) -c 'import importlib.metadata as m; print(m.version("apache-tvm"))')" \
	  "apache-tvm-ffi==$$($(PY) -c 'import importlib.metadata as m; print(m.version("apache-tvm-ffi"))')"
	touch $(NATIVE_STAMP)

native-deps: $(NATIVE_STAMP)

# Build the zoo MLP for the CPU, validate it, inspect it and run it from an .npz.
demo: $(CORE_STAMP)
	mkdir -p build
	$(RUN) $(VENV)/bin/exporter build zoo:mlp --target cpu --out build/mlp-cpu.artifact
	$(RUN) $(VENV)/bin/exporter inspect build/mlp-cpu.artifact
	$(PY) -c "import numpy as np; np.savez('build/mlp-inputs.npz', x=np.random.default_rng(0).standard_normal((4, 64), dtype=np.float32))"
	$(RUN) $(VENV)/bin/exporter run build/mlp-cpu.artifact --inputs build/mlp-inputs.npz --out build/mlp-outputs.npz

# The default tier; `make test-slow` runs the rest (docs/testing.md: what goes where). Files
# go out heaviest first (tests/conftest.py), so pytest-xdist must keep that order.
PYTEST_XDIST := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The checkout's bytecode, compiled once before the workers start: where
# PYTHONDONTWRITEBYTECODE is set (this box sets it) every worker, CLI subprocess and fresh
# interpreter compiled the project's modules again (about 0.3 CPU s each). 2 CPU s.
BYTECODE := $(PY) -m compileall -q -j 0 exporter runtime targets passes plan bench tests
# and the site-packages modules the collection imports, once: both workers compiled
# them at once (tests/bytecode.py; a fresh venv's two collections 29-35 s -> 9 + 10 s)
COLLECTION_BYTECODE := $(RUN) $(PY) -m tests.bytecode

test: install browser native-deps
	$(BYTECODE)
	$(COLLECTION_BYTECODE)
	$(TEST_ENV) $(PY) -m pytest $(PYTEST_XDIST) -m "not slow and not cuda" --durations=25

test-slow: install browser native-deps
	$(BYTECODE)
	$(COLLECTION_BYTECODE)
	$(RUN) $(PY) -m pytest $(PYTEST_XDIST) -m "slow and not cuda" --durations=25

# The coverage matrix (bench/coverage/) through `exporter matrix`: every suite model (77
# Hugging Face architectures from configs) on cpu, onnx and tvm, each build in its own
# process with a 5-minute limit; build/coverage/matrix.json, .csv and .html, then the table.
# About 2 hours on 2 cores. Settled cells are cached: running it again resumes (and an
# unchanged suite builds nothing); COVERAGE_FLAGS="--models llama,t5" narrows it,
# "--jobs N" or "--executor ray" spreads it.
coverage: install
	$(PY) -m bench.coverage.matrix --targets cpu,onnx,tvm --out build/coverage $(COVERAGE_FLAGS)
	$(PY) -m bench.coverage.matrix --render build/coverage/matrix.json

# The same on the GPU machine (torch, torchvision and timm preinstalled there): cuda at
# fp32, fp16 and bf16, plus the torchvision/timm models, several builds at a time.
coverage-gpu:
	$(PYTHON) -m bench.coverage.matrix --targets cuda --dtypes fp32,fp16,bf16 --jobs 12 \
	  --out build/coverage-gpu $(COVERAGE_FLAGS)
	$(PYTHON) -m bench.coverage.matrix --render build/coverage-gpu/matrix.json

# On the GPU machine (torch preinstalled there): runs the CUDA-marked tests.
test-gpu:
	$(PYTHON) -m pytest -m cuda

# Language-model baselines (issue 23, bench/llm): a random-weight LLaMA-shaped checkpoint,
# Hugging Face eager and static cache + torch.compile, llama.cpp (f32, Q8_0, Q4_0) and ONNX
# Runtime GenAI (fp32, int8, int4), each engine in its own process, rows appended to
# build/llm-bench.jsonl, then the table. The llama-cpp-python sdist is downloaded once:
# pip builds llama.cpp from it (native CPU flags) and its GGUF converter comes out of it.
# Its version must equal the llm-bench extra's pin (pip refuses otherwise).
LLAMA_CPP_PYTHON_VERSION ?= 0.3.36
LLM_SIZE ?= 300m
LLM_THREADS ?= 2
LLM_ENGINES ?= hf-eager,hf-static-compile,llamacpp-f32,llamacpp-q8_0,llamacpp-q4_0,ortgenai-fp32,ortgenai-int8,ortgenai-int4
LLM_SDIST := build/llm/dl/llama_cpp_python-$(LLAMA_CPP_PYTHON_VERSION).tar.gz
LLM_STAMP := $(VENV)/.installed-llm-bench-$(LLAMA_CPP_PYTHON_VERSION)

$(LLM_SDIST):
	$(PY) -m pip download --quiet --no-deps --no-binary llama-cpp-python \
	  llama-cpp-python==$(LLAMA_CPP_PYTHON_VERSION) -d build/llm/dl

$(LLM_STAMP): $(STAMP) $(LLM_SDIST)
	@echo "installing the llm-bench extra: llama-cpp-python compiles llama.cpp (10-30 minutes)"
	CMAKE_ARGS="-DGGML_NATIVE=ON" $(PY) -m pip install --quiet -e '.[llm-bench]' $(LLM_SDIST)
	$(PY) -m bench.llm.engines_llamacpp --extract $(LLM_SDIST)
	touch $(LLM_STAMP)

bench-llm: $(LLM_STAMP)
	$(PY) -m bench.llm.compare --size $(LLM_SIZE) --threads $(LLM_THREADS) \
	  --engines $(LLM_ENGINES) --out build/llm-bench.jsonl
	$(PY) -m bench.llm.compare --render build/llm-bench.jsonl

clean:
	rm -rf build .pytest_cache
