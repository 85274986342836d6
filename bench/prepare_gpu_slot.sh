#!/usr/bin/env bash
# The inputs of a GPU slot, made here (no GPU needed; pip reaches PyPI here, the device box has no
# network), into one git-ignored folder the device tool carries: .slot-carry/ (bench/slot/carry.py).
#   wheels/                 gguf and the GPU tests' packages, at this venv's versions (the README's
#                           install), for the box's Python 3.12 on x86-64; it installs only what it lacks
#   llama-cuda-sm90.tar.xz  llama.cpp's CUDA build, if bench/pack_llamacpp_cuda.sh made .peers/'s
#   smol-a/, smol-b/        the real SmolLM2's halves (bench/pack_model_parts.sh), if it is pulled here;
#                           each travels in a call of its own before the main one
# Idempotent: what is there at the right version stays. Ends with the size rule (one call: the
# working tree plus what it carries under 64 MiB), exit 1 naming what breaks it.
#
#   bash bench/prepare_gpu_slot.sh [CARRY]     (default .slot-carry)
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}; [ -x "$py" ] || py=python3
carry=${1:-.slot-carry}
mkdir -p "$carry/wheels"
# the box's image holds most of these (KINDS.md); a missing one costs a slot, a carried one ~3 MB
for dist in gguf pytest pluggy iniconfig pytest-xdist execnet hypothesis sortedcontainers attrs; do
  v=$("$py" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$dist" 2>/dev/null) \
    || { echo "prepare: $dist is not installed in $py (pip install -e '.[dev]'): not carried"; continue; }
  stem=$(echo "$dist" | tr - _)
  ls "$carry/wheels/" | grep -qi "^${stem}-${v}-" && continue
  rm -f "$carry/wheels/${stem}"-*.whl  # one version of each: two stop the whole install
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$carry/wheels" "$dist==$v"
done
if [ -f .peers/llama-cuda-sm90.tar.xz ]; then cp -u .peers/llama-cuda-sm90.tar.xz "$carry/"; fi
if "$py" -c "from sharpinf.model.registry import is_pulled; assert is_pulled('smollm2-135m')" 2>/dev/null; then
  if [ ! -d "$carry/smol-a" ] || [ ! -d "$carry/smol-b" ]; then
    bash bench/pack_model_parts.sh smollm2-135m
    rm -rf "$carry/smol-a" "$carry/smol-b" && mv .smol/a "$carry/smol-a" && mv .smol/b "$carry/smol-b" && rmdir .smol
  fi
fi
PYTHONPATH=$PWD "$py" -m bench.slot.carry --check "$carry"
