#!/usr/bin/env bash
# Cut a registered model into two pieces for device calls: one call carries at most 64 MiB, and the
# real SmolLM2 (93 MB) does not fit beside llama.cpp's binaries (42 MB). Two calls before the main
# one each carry a piece (the device machine keeps ignored paths between calls while it is warm);
# bench/gpu_slot.py joins them into its model cache with `sharpinf models pull NAME --from ...`,
# which checks the registered SHA-256. bench/prepare_gpu_slot.sh moves them to .slot-carry/smol-a, -b.
#
#   bench/pack_model_parts.sh [NAME]   (default smollm2-135m) -> .smol/a/NAME.00, .smol/b/NAME.01
#
# Then, with the device tool: run carry [".smol/a"] command "true"; run carry [".smol/b"] command
# "true"; run carry [".slot-carry"] command "bash bench/gpu_slot.sh" -- back to back, each
# within the 30 s the machine stays warm after a call.
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:-smollm2-135m}
py=${PYTHON:-.venv/bin/python}; [ -x "$py" ] || py=python3
src=$("$py" -m sharpinf models path "$name")
rm -rf .smol && mkdir -p .smol/a .smol/b
split -n 2 -d "$src" ".smol/$name."
mv ".smol/$name.00" .smol/a/ && mv ".smol/$name.01" .smol/b/
ls -l .smol/a .smol/b
