# Two commands set up a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install demo test test-kernels nvrtc-check bench clean

# (re)install when pyproject changes; an editable install, so sharpinf and oracles import from the tree
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check -e ".[dev]"
	touch $@

install: $(STAMP)

demo: install
	$(VENV)/bin/sharpinf models pull smollm2-135m
	$(VENV)/bin/sharpinf verify smollm2-135m   # auto: the GPU if usable, else the CPU emulator (~2 min)
	$(VENV)/bin/sharpinf generate smollm2-135m --chat "What is the capital of France?" --max-tokens 48

# The whole suite: NVRTC compile check of every kernel (sm_80, sm_90), then pytest
# (kernels on the emulator in forward order), then the kernel tests again in reverse order.
test: install
	$(PY) -m pytest -q
	$(MAKE) --no-print-directory test-kernels

test-kernels: install
	SHARPINF_EMU_ORDER=reverse $(PY) -m pytest -q -m kernels

nvrtc-check: install
	$(PY) -m sharpinf.runtime.nvrtc_check

bench: install
	$(PY) bench/reference_decode.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
