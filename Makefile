# Two commands set up a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python

# The extras follow the machine: cuda12 or cuda13 (cupy, NVRTC, headers) where nvidia-smi reports
# that driver, else check (NVRTC 12 for the GPU-free compile check). SHARPINF_EXTRAS=dev,cuda12 overrides.
CUDA_MAJOR      := $(shell sh .ci/cuda_major)
SHARPINF_EXTRAS ?= dev,$(if $(filter 12 13,$(CUDA_MAJOR)),cuda$(CUDA_MAJOR),check)
STAMP           := $(VENV)/.installed-$(SHARPINF_EXTRAS)

# On a switch of CUDA major, the other major's wheels go first: two cupy builds in one venv collide.
comma := ,
OTHER_MAJOR_cuda12 := cupy-cuda13x nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cuda-crt nvidia-cuda-nvdisasm
OTHER_MAJOR_cuda13 := cupy-cuda12x nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12
STALE := $(strip $(foreach e,$(subst $(comma), ,$(SHARPINF_EXTRAS)),$(OTHER_MAJOR_$(e))))

.PHONY: install demo test test-all test-kernels nvrtc-check bench gpu-check clean

# (re)install when pyproject or the extras change; an editable install, so sharpinf imports from the tree.
# uv installs it (and the dependencies) in ~7 s where pip takes ~40 (one core resolving and unpacking);
# pip stays in the venv, and does the install where uv cannot be had. No .pyc at install: Python
# compiles the modules a run imports, once, on first import.
UV := uv==0.13.9
PIP := $(PY) -m pip -q --disable-pip-version-check
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(if $(STALE),$(PY) -m pip uninstall -q -y $(STALE) 2>/dev/null || true)
	($(PIP) install "$(UV)" && $(PY) -m uv pip install -q --python $(PY) -e ".[$(SHARPINF_EXTRAS)]") \
	  || $(PIP) install --no-compile -e ".[$(SHARPINF_EXTRAS)]"
	rm -f $(VENV)/.installed*
	touch $@

install: $(STAMP)

demo: install
	$(VENV)/bin/sharpinf models pull smollm2-135m
	$(VENV)/bin/sharpinf verify smollm2-135m   # auto: the GPU if usable, else the CPU emulator (~2 min)
	$(VENV)/bin/sharpinf generate smollm2-135m --chat "What is the capital of France?" --max-tokens 48

# `make test` (what CI runs): the suite on every core (pytest-xdist; a test file whose fixtures
# are costly stays on one worker, tests/conftest.py), then the kernel tests again with the
# emulator's threads in reverse order (the race check keeps two readers a byte, so which race it
# sees can follow the order too) and strict memcheck (each allocation flush against a PROT_NONE
# page: a load past any buffer faults, naming the thread -- the default guard bytes see stores
# only; no slower here: 88 s against 94) -- each kernel test's first case and a fixed third of the
# others (tests/conftest.py's reverse_pass_sample). The forward-pass cross-path oracles run on a subset of
# models that holds every weight type and arch (tests/test_forward_oracles.py says why).
# `make test-all`: every model in every oracle, more hypothesis examples, and every test that
# runs kernels again in reverse order -- for sessions that change kernels.
# Python images set PYTHONDONTWRITEBYTECODE=1: then every process -- each pytest worker, each CLI or
# server the tests start -- compiles every module it imports again (a worker's collection 15 s instead
# of 6, `sharpinf kernels list` 1.8 s instead of 0.9). The tests let Python keep its .pyc files.
unexport PYTHONDONTWRITEBYTECODE
JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && n=4; echo $$n)
XDIST := -n $(JOBS) --dist loadgroup
test: install
	$(PY) -m pytest -q $(XDIST)
	$(MAKE) --no-print-directory test-kernels

test-kernels: install
	SHARPINF_EMU_ORDER=reverse SHARPINF_EMU_MEMCHECK=strict $(PY) -m pytest -q $(XDIST) -m "kernels and emu_checks"

test-all: install
	SHARPINF_TEST_TIER=all $(PY) -m pytest -q $(XDIST)
	SHARPINF_TEST_TIER=all SHARPINF_EMU_ORDER=reverse SHARPINF_EMU_MEMCHECK=strict $(PY) -m pytest -q $(XDIST) -m kernels

nvrtc-check: install
	$(PY) -m sharpinf.runtime.nvrtc_check

bench: install
	$(PY) bench/reference_decode.py

# On a machine with an NVIDIA GPU: the GPU tests, `sharpinf verify --backend cuda` on SmolLM2 (or a
# synthetic model of its shape), single-stream decode eager and with graphs, the bench suites, and
# llama.cpp on the same files (peers: build it from .peers/, a copy of ../shared/peers/);
# writes bench/results/gpu/<gpu>-<date>.json. PARTS=tests,verify,stream,bench,peers picks some.
gpu-check: install
	$(PY) bench/gpu_check.py $(if $(PARTS),--only $(PARTS))

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
