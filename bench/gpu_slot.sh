#!/usr/bin/env bash
# A short GPU slot (the device tool: ~15 min of wall in all, commands of <= 10 min, <= 8 files back, a bare
# box) spent by plan. The stages, in order, each with its own budget (bench/slot/plan.py):
#   setup    the carried wheels installed (only what the box lacks) and what the runs import checked,
#            before anything is spent; the shape models made
#   gate     pytest -m gpu on the kernel tests of every variant, those never timed on a GPU first; a
#            failing variant is named and left out of the timed stages (bench/slot/gate.py)
#   peers    pp512, tg128, decode_s1/s8/s64 on both shape models beside llama.cpp's figures (its build
#            if carried, else the newest committed run's on the same GPU, commit and file)
#   matmul   the 8B-shape matmul suite at N = 1, 8, 16, 64, 512, every variant
#   tuned    matmul=tuned's 8B decode at B = 1, 8, 64 and single stream
#   pdl      PDL's bits, then single-stream decode off and on
#   then, only with time left: attention, floor (SmolLM2's launch floor), sampling, prefill, probes, ncu,
#   moe, oracles. A run that no longer fits is skipped and says so.
# What each figure decides is written beside the rule it decides (the plan's comments say where).
#
#   bash bench/gpu_slot.sh [--stages a,b] [--fresh]
#
# Environment: GPU_SLOT_S seconds for the whole slot, over every command (default 780);
# GPU_SLOT_CALL_S for this command (default 560, under the tool's 600 s kill); GPU_SLOT_DRY=1 walks
# every stage on a fake clock without a GPU, each bench command line checked by its --dry-run
# (tests/test_gpu_slot.py); GPU_SLOT_FAKE '{"run id": seconds}' for that walk; OUT (the device tool's).
# Writes into $OUT only results.tgz (the result folder <gpu>-<date>/, logs and state inside),
# summary.md (stages run and skipped and why, every figure beside the previous run's) and slot.log,
# after every stage, atomically. Each suite writes its rows as it times them, so a cut run keeps them.
# A second command resumes where the first stopped (the state in .slot/, which the warm box keeps).
# Its inputs: bench/prepare_gpu_slot.sh, here, makes .slot-carry/ (carry it).
set -uo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" bench/gpu_slot.py "$@"
