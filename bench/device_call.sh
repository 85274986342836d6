#!/usr/bin/env bash
# One call on a lent GPU machine (the device tool): sharpinf's GPU benchmarks and GPU tests, in the
# order a short lease should spend them. Why each run is there, and what its figures decide: the
# device runbook in docs/kernel-notes.md.
#
#   bash bench/device_call.sh [STAGES]     STAGES: a comma list of peers, kernels, probes, ncu, tests
#                                          (the default: all five), moe (on request)
#   setup    the gguf wheel, llama.cpp's build, the real SmolLM2 (if carried), the shape models; then
#            the attention walks' same-bits check (if it fails, the call keeps the split launches)
#   peers    llama.cpp beside sharpinf, each timed alone on the GPU (bench/gpu_check.py --only peers)
#   moe      the peers part on the Qwen3-30B-A3B shape, and the moe kernels (bench/results/gpu/moe/)
#   kernels  the matmul variants on the 8B shape at the token counts that set the thresholds,
#            attention (split and walk), SmolLM2's decode, PDL, sampling, packed prefill, matmul=timed
#   probes   the same kernels compiled another way (SHARPINF_NVRTC_OPTIONS: the kernels' #ifndef
#            knobs), gemv's 8B decode, the link kernels
#   ncu      Nsight Compute counters of the kernels the next kernel work is about (bench/ncu_targets.py)
#   tests    pytest -m gpu: the kernel tests, then the forward-pass oracles, with what time is left
#
# Environment:
#   OUT              where the logs go (default /tmp/sharpinf-device-out; the device tool's $OUT)
#   DEVICE_BUDGET_S  the call's deadline in seconds (default 540)
#   DEVICE_DRY=1     no GPU: every `sharpinf bench` and gpu_check.py run checked with --dry-run, the rest
#                    only named; nothing installed, built or written outside $OUT (tests/test_device_call.py)
# What the call carries (git-ignored paths, the device tool's `carry`):
#   .whl/            the gguf wheel (the device image lacks it):
#                    pip download --no-deps --only-binary=:all: -d .whl gguf==<the venv's version>
#   .smol/a, .smol/b the real SmolLM2 in two pieces (bench/pack_model_parts.sh), each carried by a call of
#                    its own just before this one; joined and SHA-checked here (without them: shape models)
#   .peers/llama-cuda-sm90.tar.xz  llama.cpp's CUDA build (bench/pack_llamacpp_cuda.sh), unpacked into
#                    .peers/llama/bin; cuBLAS is the device's own (its PyTorch's nvidia-cublas wheel)
# The device machine has no network; python3 there is the image's (CuPy, NumPy, torch).
#
# Writes: a log per run under $OUT; the results in bench/results/gpu/<gpu>-<date>/ (moe:
# bench/results/gpu/moe/), packed into $OUT/results.tgz after each stage (with kernel-tables.md).
# Time: the device tool kills a command at 600 s; every run gets at most its own limit and what is
# left of DEVICE_BUDGET_S, a run with under 20 s left is skipped, and the results are packed after
# each stage, so a cut call still brings back what it ran. A second call, `bash bench/device_call.sh
# probes` (or `tests`), takes up what the first left.
set -uo pipefail
cd "$(dirname "$0")/.."
STAGES=${1:-peers,kernels,probes,ncu,tests}
MOE=qwen3-30b-a3b-shape:Q4_K
OUT=${OUT:-/tmp/sharpinf-device-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0)) s] $*"; }
has() { [[ ",$STAGES," == *",$1,"* ]]; }
# DEVICE_DRY=1 (no GPU needed; tests/test_device_call.py): every `sharpinf bench` run checked with --dry-run
# (its sizes, --kernels, --op, --variant, the model's name), gpu_check.py's too (its parts and peers sizes),
# the rest only named -- so a typo costs a test, not a device call's minutes. Nothing is installed, built,
# packed or written outside $OUT.
DRY=${DEVICE_DRY:-0}
[[ "$DRY" == [01] ]] || { echo "DEVICE_DRY must be 0 or 1, got '$DRY'"; exit 2; }
dry_checked=0 dry_failed=0
# The device tool kills a command at 600 s and brings back what is under $OUT then: every run below
# gets at most what is left of DEVICE_BUDGET_S (default 540: the tar and the transfer fit after it),
# a run with under 20 s left is skipped, and the results are packed after each stage.
DEADLINE=${DEVICE_BUDGET_S:-540}
left() { echo $(( DEADLINE - ($(date +%s) - t0) )); }
run() {  # run LOG SECONDS CMD...: CMD's output to $OUT/LOG under a timeout of min(SECONDS, what is left)
  local log=$1 want=$2 l
  shift 2
  if [ "$DRY" = 1 ]; then
    if [[ " $* " == *" -m sharpinf bench "* || " $* " == *" bench/gpu_check.py "* ]]; then
      dry_checked=$((dry_checked + 1))
      "$@" --dry-run > "$OUT/$log" 2>&1 || { dry_failed=$((dry_failed + 1)); stamp "dry: $log FAILED: $*"; cat "$OUT/$log"; }
    else : > "$OUT/$log"; stamp "dry: $log would run $1 $2"; fi
    return 0
  fi
  l=$(left)
  if [ "$l" -lt 20 ]; then stamp "skipped $log: ${l} s left"; return 124; fi
  timeout -s INT $(( want < l ? want : l )) "$@" > "$OUT/$log" 2>&1
}
pack() {  # the results so far, with the kernels runs' tables in markdown (bench/kernel_tables.py) for the README
  [ "$DRY" = 1 ] && return 0
  local runs; runs=$(find "${RUN:-/nonexistent}" -name kernels.json 2>/dev/null | sort)
  [ -n "$runs" ] && python3 bench/kernel_tables.py $runs > "$RUN/kernel-tables.md" 2>/dev/null
  tar czf "$OUT/results.tgz" bench/results/gpu 2>/dev/null
}

if [ "$DRY" = 1 ]; then
  export PYTHONPATH=$PWD
  GPU=dry
  RUN=$OUT/dry-run
else
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "gguf wheel did not install"; exit 1; }
export PYTHONPATH=$PWD:/tmp/site
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv | tee -a "$OUT/setup.log"

# llama.cpp's libraries beside its binaries, the driver's cuBLAS from the image's wheels
for t in .peers/llama-*.tar.xz; do [ -f "$t" ] && [ ! -d .peers/llama/bin ] && mkdir -p .peers/llama && tar xJf "$t" -C .peers/llama; done
if [ -d .peers/llama/bin ]; then
  cub=$(python3 -c 'import glob,os,site; print(next((os.path.dirname(p) for r in site.getsitepackages()
    for p in glob.glob(os.path.join(r,"nvidia","**","libcublas.so.*"),recursive=True)), ""))')
  export LD_LIBRARY_PATH=$PWD/.peers/llama/bin:${cub}:${LD_LIBRARY_PATH:-}
  stamp "cuBLAS from ${cub:-nowhere}"
  ldd .peers/llama/bin/libggml-cuda.so.0 2>&1 | grep -E "not found|cublas|cudart" | tee -a "$OUT/setup.log"
fi

# the real SmolLM2, if two earlier calls left its pieces (see the header): what `sharpinf models pull
# smollm2-135m --from A --from B` does (the registered SHA-256 checked), without the CLI's imports
if ls .smol/a/* .smol/b/* >/dev/null 2>&1; then
  if python3 -c "import sys; from sharpinf.model.registry import pull; print(pull('smollm2-135m', sources=sys.argv[1:]))" \
      .smol/a/* .smol/b/* >> "$OUT/setup.log" 2>&1; then stamp "real SmolLM2 joined"
  else stamp "real SmolLM2: the pieces did not join (setup.log); the shape models only"; fi
fi

# the benchmark models, made once (tiled random weights; ~15 s for the 8B shape)
python3 -c "from sharpinf.model.synth import shape_model as s; print(s('smollm2-135m','Q4_1'), s('qwen3-8b','Q4_K'))" \
  >> "$OUT/setup.log" 2>&1 || { stamp "shape models failed"; tail -5 "$OUT/setup.log"; }
stamp "models ready"

GPU=$(python3 -c "
import re; from sharpinf.runtime.select import get_backend
f = get_backend('cuda').describe(); print(re.sub(r'[^A-Za-z0-9]+', '-', f.get('gpu') or f['device']).strip('-').lower())")
RUN=bench/results/gpu/$GPU-$(date +%Y%m%d)
fi
mkdir -p "$RUN"
stamp "results in $RUN"

# The attention walks had never run on a GPU when auto began to take them there (ops/attention.py's
# walks_pays, 2026-11-28): their same-bits test against the split launches first (f16, both kernels,
# the models' cache type); if it fails, every later run of this call keeps the split launch, so the
# peers figures stand -- walk-check.log says what broke.
stamp "attention walks against the split launches"
if run walk-check.log 120 python3 -m pytest -q -x -p no:cacheprovider tests/test_kernels_attention.py \
    -k "same_bits and cuda-f16"; then stamp "walk check passed"
else
  stamp "walk check FAILED (walk-check.log): SHARPINF_ATTENTION_MODE=split from here"; tail -5 "$OUT/walk-check.log"
  export SHARPINF_ATTENTION_MODE=split
fi

if has peers; then
  stamp "peers"
  run peers.log 300 python3 bench/gpu_check.py --only peers --kernels fast --llamacpp .peers/llama --peers-sizes "r=3"
  stamp "peers exit $?"; grep -vE "^\+ " "$OUT/peers.log" | tail -25
  pack
fi
if has moe; then
  stamp "moe: peers on $MOE"
  [ "$DRY" = 1 ] || python3 -c "from sharpinf.model.synth import shape_model as s; print(s('qwen3-30b-a3b','Q4_K'))" \
    >> "$OUT/setup.log" 2>&1
  stamp "moe model ready"
  run moe.log 420 python3 bench/gpu_check.py --only peers --kernels fast --llamacpp .peers/llama \
    --peers-models "$MOE" --peers-sizes "r=2" --out bench/results/gpu/moe
  stamp "moe exit $?"; grep -vE "^\+ " "$OUT/moe.log" | tail -12
  # the routed FFN alone in each moe variant that serves the step (the registry's min/max_tokens): fast
  # (dp4a tiles of 8 pairs), gemv (<= 8 tokens, one tile an expert on gemv_rows' row stream; never timed)
  # and mmq (>= 16 tokens) -- if gemv beats fast at 1 and 8 tokens, the fast set can take it for decode
  run kernels-moe.log 120 python3 -m sharpinf bench "$MOE" --backend cuda --suite kernels --op moe \
    --variant grouped,gemv,mmq --batch-sizes 1,8,64 --prefill-sizes 512 --repeats 3 --out "$RUN/qwen3-30b-a3b-shape-moe"
  stamp "moe kernels exit $?"; grep -vE "^\+ " "$OUT/kernels-moe.log" | tail -12
  pack
fi
if has kernels; then
  # In this order: what the issues' acceptance reads first (the matmul thresholds, attention, SmolLM2's
  # decode with and without the launch-floor kernels, sampling, packed prefill, the 8B step at 64
  # sequences), then the probes -- the first call's DEADLINE cuts whatever does not fit, and the
  # results are packed halfway so that a cut call still brings the first half back.
  # the matmul family (norm, matmul, gate+up) at the token counts that set the variants' thresholds
  # (gemv's max_tokens, mmq's min_tokens), and attention for decode and prefill (split vs flash)
  stamp "kernels: matmul variants on the 8B shape"
  run kernels-matmul.log 120 python3 -m sharpinf bench qwen3-8b-shape:Q4_K --backend cuda --suite kernels --op matmul \
    --batch-sizes 1,4,8,16,32,64 --prefill-sizes 128,512 --repeats 3 --out "$RUN/qwen3-8b-shape-matmul" \
   
  stamp "kernels matmul exit $?"
  stamp "kernels: attention on the 8B shape"
  SHARPINF_ATTENTION_MODE=split run kernels-attention.log 80 python3 -m sharpinf bench qwen3-8b-shape:Q4_K --backend cuda --suite kernels --op attention \
    --batch-sizes 1,64 --context 512 --prefill-sizes 512,2048 --repeats 3 --out "$RUN/qwen3-8b-shape-attention" \
   
  stamp "kernels attention exit $?"
  # the walk forced (the rows above are the split launches, forced: comparable with 2026-11-26's; each
  # row's rule_shape says which of the two auto takes), then both shapes at a 4,096-key decode, where
  # the walk's one block a query has 64 partitions to go through twice
  stamp "kernels: attention, the walk"
  SHARPINF_ATTENTION_MODE=walk run kernels-attention-walk.log 80 python3 -m sharpinf bench qwen3-8b-shape:Q4_K \
    --backend cuda --suite kernels --op attention --variant split,flash --batch-sizes 1,64 --context 512 \
    --prefill-sizes 512,2048 --repeats 3 --out "$RUN/qwen3-8b-shape-attention-walk"
  stamp "kernels attention walk exit $?"
  for m in split walk; do
    SHARPINF_ATTENTION_MODE=$m run kernels-attention-4k-$m.log 45 python3 -m sharpinf bench qwen3-8b-shape:Q4_K \
      --backend cuda --suite kernels --op attention --variant split,flash --batch-sizes 8,64 --context 4096 \
      --prefill-sizes '' --repeats 3 --out "$RUN/qwen3-8b-shape-attention-4k-$m"
    stamp "kernels attention 4k $m exit $?"
  done
  # the launch-shape rule's two constants fitted to the split and walk times above (reads the JSON, no
  # GPU): each case's both times and both picks, and the pair to set in ops/attention.py
  [ "$DRY" = 1 ] || python3 bench/walk_rule_fit.py "$RUN"/qwen3-8b-shape-attention{,-walk,-4k-split,-4k-walk}/kernels.json \
    > "$OUT/walk-rule-fit.log" 2>&1
  [ "$DRY" = 1 ] || tail -2 "$OUT/walk-rule-fit.log"
  for k in fast ffn layer; do
    spec=$k  # the fused FFN (ffn=fused) and the link (link=layer), each beside dp4a's linear layers
    [ $k = ffn ] && spec="matmul=dp4a,ffn=fused,attention=split,rope_kv=fused,sample=radix"
    [ $k = layer ] && spec="matmul=dp4a,link=layer,attention=split,rope_kv=fused,sample=radix"
    stamp "decode: SmolLM2 shape, kernels $spec"
    run decode-$k.log 60 python3 -m sharpinf bench smollm2-135m-shape:Q4_1 --backend cuda --suite decode --kernels "$spec" \
      --batch-sizes 1,8 --out "$RUN/smollm2-135m-shape-decode-$k"
    stamp "decode $k exit $?"; grep -E "decode step at|host gap" "$OUT/decode-$k.log"
  done
  # programmatic dependent launch (docs/kernel-notes.md, runbook item 7): its bits against ordinary launches, then single-stream
  # decode off and on, both shapes (~25 s a run on the H200 by the 2026-11-26 single-stream rows)
  stamp "pdl: bits against ordinary launches"
  if SHARPINF_PDL=1 run pdl-check.log 120 python3 -m pytest -q -x -p no:cacheprovider tests/test_pdl.py \
      -k ordinary_ones; then
    stamp "pdl check passed"
    for m in smollm2-135m-shape:Q4_1 qwen3-8b-shape:Q4_K; do
      for p in 0 1; do
        SHARPINF_PDL=$p run "tg-pdl$p-${m%%-*}.log" 50 python3 bench/single_stream.py --model "$m" --backend cuda \
          --kernels fast --prompt 1 --decode 128 --repeats 3 --out "$RUN/single_stream_${m%%:*}_pdl$p.json"
        stamp "tg pdl=$p $m exit $?"; grep -iE "decode" "$OUT/tg-pdl$p-${m%%-*}.log" | tail -2
      done
    done
  else stamp "pdl check FAILED (pdl-check.log): no PDL timing"; tail -5 "$OUT/pdl-check.log"; fi
  # the head's sampling over Qwen3's 152k vocabulary (temperature 1, top-k 50, top-p 0.9):
  # sampling.cu's block a row vs sampling_radix.cu's row over many blocks (issue 20: <= 20 us a row)
  stamp "kernels: sampling on the 8B shape"
  run kernels-sample.log 60 python3 -m sharpinf bench qwen3-8b-shape:Q4_K --backend cuda --suite kernels --op sample \
    --batch-sizes 1,8,64 --prefill-sizes 128 --repeats 5 --out "$RUN/qwen3-8b-shape-sample" \
   
  stamp "kernels sample exit $?"
  # packed prefill (issue 19: SmolLM2's 8 x 128 packed >= 4x sequential), fast and the tensor set beside it
  stamp "prefill: SmolLM2 shape, 8 x 128 packed vs sequential"
  run prefill.log 60 python3 -m sharpinf bench smollm2-135m-shape:Q4_1 --backend cuda --suite prefill --kernels fast \
    --prefill-prompts 8 --prefill-len 128 --repeats 5 --out "$RUN/smollm2-135m-shape-prefill"
  stamp "prefill exit $?"; grep -iE "packed|x sequential" "$OUT/prefill.log" | tail -4
  pack
  # the decode step at 1, 8 and 64 sequences on the 8B shape with matmul=timed: each launch shape on the
  # fastest of dp4a, gemv, mmq and mmq_narrow by the GPU's clock (ops/matmul_tuned.py; never run on a
  # GPU before) -- fast's own figures at B = 1, 8, 64 are the peers part's decode_sN rows (the same
  # suite, context 192). Issue 19: the N = 64 step <= 2x the N = 1 step. The JSON's matmul_tuned rows
  # hold every candidate's time a shape: if tuned beats fast, the fast set takes it (variants.py SETS)
  stamp "decode: 8B shape, matmul=timed"
  run decode8b-tuned.log 90 python3 -m sharpinf bench qwen3-8b-shape:Q4_K --backend cuda --suite decode \
    --kernels tuned --batch-sizes 1,8,64 --context 192 \
    --out "$RUN/qwen3-8b-shape-decode-tuned"
  stamp "decode 8B tuned exit $?"; grep -E "decode step at|host gap" "$OUT/decode8b-tuned.log"
  # and single-stream decode through the engine on it (graphs; beside the peers part's tg128 on fast)
  run tg-tuned-qwen3.log 50 python3 bench/single_stream.py --model qwen3-8b-shape:Q4_K --backend cuda \
    --kernels tuned --prompt 1 --decode 128 \
    --repeats 3 --out "$RUN/single_stream_qwen3-8b-shape_tuned.json"
  stamp "tg tuned exit $?"; grep -iE "decode" "$OUT/tg-tuned-qwen3.log" | tail -2
  pack
fi
if has probes; then
  # occupancy probe: the same mmq rows with each output's group sum in shared memory, not registers,
  # and ptxas held to 128 registers (mmq_rows.cuh's MQ_GROUP_SHARED and MQ_MIN_BLOCKS_1, through
  # SHARPINF_NVRTC_OPTIONS, which reaches every kernel's compile; --maxrregcount does not reach entries
  # with launch bounds): matmul_mmq_q4_k 166 -> 128 registers without spills (NVRTC 12.9; held to 128
  # with the sums in registers it spilled 64 bytes), 4 blocks of 4 warps an SM instead of 3, for a load
  # and a store an output at each member's end (the same bits: test_kernels_matmul_variants's tier-all
  # test) -- if it wins at 64 and 512 tokens, both become the default for every type but Q6_K (16
  # bytes of spills at 128)
  stamp "kernels: mmq with 4 blocks an SM"
  SHARPINF_NVRTC_OPTIONS="-DMQ_GROUP_SHARED=1 -DMQ_MIN_BLOCKS_1=4" run kernels-mmq-r128.log 60 python3 -m sharpinf bench qwen3-8b-shape:Q4_K \
    --backend cuda --suite kernels --op matmul --variant dp4a,mmq --batch-sizes 64 --prefill-sizes 512 --repeats 3 \
    --out "$RUN/qwen3-8b-shape-matmul-mmq-r128"
  stamp "kernels mmq r128 exit $?"
  # conversion probe: the chunk terms' int -> float by the conversion unit (DP_I2F_CVT=1: one I2F a term,
  # as llama.cpp's mmq) instead of dp4a.cuh's integer-and-float-add trick: matmul_mmq_q4_k 480 -> 440
  # instructions an iteration (sass_mix, 2026-11-28), but 40 I2F a warp a chunk on a pipe of 16 a clock
  # an SM, by estimate as busy as the issue then -- if mmq wins at 512 tokens, DP_I2F_CVT becomes 1
  # (or half the terms take it); the same bits either way
  stamp "kernels: mmq with I2F"
  SHARPINF_NVRTC_OPTIONS=-DDP_I2F_CVT=1 run kernels-mmq-i2f.log 60 python3 -m sharpinf bench qwen3-8b-shape:Q4_K \
    --backend cuda --suite kernels --op matmul --variant dp4a,mmq --batch-sizes 64 --prefill-sizes 512 --repeats 3 \
    --out "$RUN/qwen3-8b-shape-matmul-mmq-i2f"
  stamp "kernels mmq i2f exit $?"
  # G probe: the matvecs with G from n_in at run time (DP_FIXED_G=0), as before 2026-11-28, against the
  # kernels-matmul run above (the _g16 and _g32 entries: G a compile-time constant, 10-32% fewer
  # instructions a chunk at the same registers) -- it says what the instructions were costing; if
  # DP_FIXED_G=0 is faster anywhere, DP_FIXED_G becomes 0
  stamp "kernels: matvecs with G at run time"
  SHARPINF_NVRTC_OPTIONS=-DDP_FIXED_G=0 run kernels-dp4a-g0.log 60 python3 -m sharpinf bench qwen3-8b-shape:Q4_K \
    --backend cuda --suite kernels --op matmul --variant dp4a,gemv --batch-sizes 1,8 --prefill-sizes 16 --repeats 3 \
    --out "$RUN/qwen3-8b-shape-matmul-dp4a-g0"
  stamp "kernels dp4a g0 exit $?"
  # token-loop probe: dp4a's chunk leaving its token loop at the step's last token (dp4a.cuh's
  # DP_TILE_BREAK=1, which the fused kernels take since 2026-11-29): matmul_dp4a_q4_k_g32's chunk at N = 1
  # 102 -> 85 instructions, but 48 -> 55 registers (10 -> 9 blocks an SM), gate+up 56 -> 66 (9 -> 7) --
  # against kernels-matmul's dp4a rows at N = 1 and 8; if it wins there, DP_TILE_BREAK becomes 1
  stamp "kernels: dp4a leaving the token loop"
  SHARPINF_NVRTC_OPTIONS=-DDP_TILE_BREAK=1 run kernels-dp4a-break.log 45 python3 -m sharpinf bench qwen3-8b-shape:Q4_K \
    --backend cuda --suite kernels --op matmul --variant dp4a --batch-sizes 1,8 --prefill-sizes '' --repeats 3 \
    --out "$RUN/qwen3-8b-shape-matmul-dp4a-break"
  stamp "kernels dp4a break exit $?"
  # gemv streamed (2026-11-28, never timed): a lane's batch of chunks fetched a batch ahead, a warp's
  # rows one stream, one wave of blocks (docs/kernel-notes.md's gemv: its batches had been one round trip
  # a chunk). Against kernels-matmul's gemv and dp4a rows at N = 1-8 (which already run it), the batch
  # halved (GV_U=2: 72 registers, 28 warps an SM, not 128 and 16), then the 8B decode step on gemv --
  # if gemv beats dp4a at N <= 8 on every shape, best's rule (matmul_mmq.matmul_best) takes gemv there
  stamp "kernels: gemv with half the batch"
  SHARPINF_NVRTC_OPTIONS=-DGV_U=2 run kernels-gemv-u2.log 45 python3 -m sharpinf bench qwen3-8b-shape:Q4_K \
    --backend cuda --suite kernels --op matmul --variant gemv --batch-sizes 1,4,8 --prefill-sizes 16 --repeats 3 \
    --out "$RUN/qwen3-8b-shape-matmul-gemv-u2"
  stamp "kernels gemv u2 exit $?"
  # gemv's coalesced runs (gemv_rows.cuh's GV_COALESCE, 2026-11-28, never timed): a row's G lanes load
  # the chunks they take together as consecutive words, each lane's chunk through shared memory. The
  # real SmolLM2's Q4_1 layers and Q8_0 LM head (the shape model where the real file did not join) with
  # no type coalesced (0), the 2-byte aligned ones (1, the default: Q4_0, Q5_0, Q8_0, Q6_K) and all (2),
  # dp4a's rows beside each; then the 8B shape's Q4_K at 2 against kernels-matmul's gemv rows. Keep
  # the level that wins per type; if 0 wins everywhere, GV_COALESCE becomes 0 (the instructions cost
  # more than the L1 passes they save). Q6_K has no model here (a real Q4_K_M file's LM head is one).
  smol=smollm2-135m; python3 -c "from sharpinf.model.registry import is_pulled; assert is_pulled('$smol')" >/dev/null 2>&1 \
    || smol=smollm2-135m-shape:Q4_1
  for lv in 0 1 2; do
    stamp "kernels: gemv, GV_COALESCE=$lv on $smol"
    SHARPINF_NVRTC_OPTIONS=-DGV_COALESCE=$lv run kernels-gemv-co$lv.log 30 python3 -m sharpinf bench "$smol" \
      --backend cuda --suite kernels --op matmul --variant dp4a,gemv --batch-sizes 1,8 --prefill-sizes 16 --repeats 5 \
      --out "$RUN/smollm2-135m-matmul-gemv-co$lv"
    stamp "kernels gemv co$lv exit $?"
  done
  SHARPINF_NVRTC_OPTIONS=-DGV_COALESCE=2 run kernels-gemv-co2-8b.log 30 python3 -m sharpinf bench qwen3-8b-shape:Q4_K \
    --backend cuda --suite kernels --op matmul --variant gemv --batch-sizes 1,8 --prefill-sizes 16 --repeats 3 \
    --out "$RUN/qwen3-8b-shape-matmul-gemv-co2"
  stamp "kernels gemv co2 8b exit $?"
  stamp "decode: 8B shape, matmul=gemv"
  run decode8b-gemv.log 60 python3 -m sharpinf bench qwen3-8b-shape:Q4_K --backend cuda --suite decode \
    --kernels "matmul=gemv,attention=split,rope_kv=fused,sample=radix" --batch-sizes 1,8 --context 192 \
    --out "$RUN/qwen3-8b-shape-decode-gemv"
  stamp "decode 8B gemv exit $?"; grep -E "decode step at|host gap" "$OUT/decode8b-gemv.log"
  # the launch floor (issue 20): SmolLM2's shape decoding at 1 and 8 sequences, graphs on, in the fast
  # set and with the decode layer in two launches (link=layer) or seven (ffn=fused) -- the same bits
  stamp "kernels: the fused FFN and the link on SmolLM2's shape"
  run kernels-link.log 60 python3 -m sharpinf bench smollm2-135m-shape:Q4_1 --backend cuda --suite kernels --op ffn,link \
    --batch-sizes 1,8 --prefill-sizes 128 --repeats 5 --out "$RUN/smollm2-135m-shape-link"
  stamp "kernels link exit $?"
  # the fused kernels' registers (2026-11-29): link=layer held to 8 blocks an SM (LK_MIN_BLOCKS: 64
  # registers, 4-8% more instructions a chunk; unbound 108-149, 3-4 blocks), the FFN unbound (72-80 in
  # these two models' entries; held to 8 blocks, 64, up to 12% more) -- both then the other way round, on
  # SmolLM2's shape (beside kernels-link.log) and on the 8B's (never timed: one wave of 3 blocks an SM
  # would walk its 12,288 gate+up rows in 8 passes). Keep, per kernel, the bound that wins at 1 and 8
  # tokens.
  run kernels-link-8b.log 60 python3 -m sharpinf bench qwen3-8b-shape:Q4_K --backend cuda --suite kernels \
    --op ffn,link --batch-sizes 1,8 --prefill-sizes '' --repeats 3 --out "$RUN/qwen3-8b-shape-link"
  stamp "kernels link 8b exit $?"
  for m in smollm2-135m-shape:Q4_1 qwen3-8b-shape:Q4_K; do
    SHARPINF_NVRTC_OPTIONS="-DLK_MIN_BLOCKS=0 -DFFN_MIN_BLOCKS=8" run "kernels-link-bounds-${m%%-*}.log" 60 \
      python3 -m sharpinf bench "$m" --backend cuda --suite kernels --op ffn,link --batch-sizes 1,8 \
      --prefill-sizes '' --repeats 3 --out "$RUN/${m%%:*}-link-bounds"
    stamp "kernels link bounds $m exit $?"
  done
  # programmatic dependent launch in the kernels suite: its graph-replayed launches of one matvec back to
  # back, each block's first rows asked of L2 before its wait -- the N = 1 and 8 rows beside
  # kernels-matmul's (issue 20: >= 70% of the copy bandwidth)
  stamp "kernels: the matvecs, SHARPINF_PDL=1"
  SHARPINF_PDL=1 run kernels-pdl.log 45 python3 -m sharpinf bench qwen3-8b-shape:Q4_K --backend cuda --suite kernels \
    --op matmul --variant dp4a,gemv --batch-sizes 1,8 --prefill-sizes '' --repeats 3 --out "$RUN/qwen3-8b-shape-matmul-pdl"
  stamp "kernels pdl exit $?"
  # programmatic dependent launch in the decode suite (eager forward passes), beside decode-fast.log
  stamp "decode: SmolLM2 shape, fast, SHARPINF_PDL=1"
  SHARPINF_PDL=1 run decode-fast-pdl.log 60 python3 -m sharpinf bench smollm2-135m-shape:Q4_1 --backend cuda \
    --suite decode --kernels fast --batch-sizes 1,8 --out "$RUN/smollm2-135m-shape-decode-fast-pdl"
  stamp "decode fast pdl exit $?"; grep -E "decode step at|host gap" "$OUT/decode-fast-pdl.log"
  # the compile-time-G matvecs end to end: fast with G from n_in at run time (DP_FIXED_G=0) beside
  # decode-fast.log (SmolLM2's QKV, o and gate+up take the _g16 entries, its down the _g32)
  stamp "decode: SmolLM2 shape, fast, G at run time"
  SHARPINF_NVRTC_OPTIONS=-DDP_FIXED_G=0 run decode-fast-g0.log 60 python3 -m sharpinf bench smollm2-135m-shape:Q4_1 \
    --backend cuda --suite decode --kernels fast --batch-sizes 1,8 --out "$RUN/smollm2-135m-shape-decode-fast-g0"
  stamp "decode fast g0 exit $?"; grep -E "decode step at|host gap" "$OUT/decode-fast-g0.log"
  pack
fi
if has ncu; then
  # hardware counters (Nsight Compute) of the kernels the next kernel work is about, one launch each
  # (bench/ncu_targets.py, in the order its log prints): the matvecs at N = 1 (issue 20: >= 70% of the
  # copy bandwidth), dp4a / mmq / mmq_narrow at N = 64 (issue 19: the 64-sequence step), mmq at 512
  # (pp512), split attention decoding at 512 keys. What to read: SchedulerStats' issue-slot use and
  # WarpStateStats' stall reasons -- issue-bound (bench/sass_mix.py counts what an iteration issues)
  # or waiting (barrier, long scoreboard: more warps or more loads in flight).
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
  if [ -n "$NCU" ]; then
    stamp "ncu: matvecs, the 64-token step, pp512's GEMM, decode attention (8B shape)"
    run ncu.log 180 "$NCU" --clock-control none --profile-from-start off \
      -k regex:'^((matmul|gate_up)_(dp4a|mmq|mmq_narrow)_q4_k(_g16|_g32)?|attention_split_.*)$' \
      --section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats \
      --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
      python3 bench/ncu_targets.py qwen3-8b-shape:Q4_K --backend cuda --op matmul,ffn_in,attention \
      --variant dp4a,mmq,mmq_narrow,split --decode 1,64 --prefill 512 --context 512
    stamp "ncu exit $?"; grep -cE "^  [a-z_0-9]+ \(" "$OUT/ncu.log" | sed 's/^/kernels profiled: /'
    cp "$OUT/ncu.log" "$RUN/ncu-qwen3-8b-shape.txt" 2>/dev/null
    # the legacy types' matvecs (SmolLM2's shape, Q4_1 and its q8_0 LM head), whose lanes load a block
    # apart: L1 sectors per request against the Q4_K rows above (docs/kernel-notes.md, runbook item 6)
    stamp "ncu: SmolLM2 shape's matvecs"
    run ncu-smollm2.log 60 "$NCU" --clock-control none --profile-from-start off \
      -k regex:'^(matmul|gate_up)_dp4a_q(4_1|8_0)(_g16|_g32)?$' --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section SchedulerStats --section WarpStateStats \
      python3 bench/ncu_targets.py smollm2-135m-shape:Q4_1 --backend cuda --op matmul,ffn_in --variant dp4a \
      --decode 1 --prefill ''
    stamp "ncu smollm2 exit $?"
    cp "$OUT/ncu-smollm2.log" "$RUN/ncu-smollm2-135m-shape.txt" 2>/dev/null
    pack
  else
    stamp "ncu: not on this machine"
  fi
fi
if has tests && [ "$DRY" != 1 ]; then
  # the kernel tests first (each kernel against its NumPy reference, every variant), then the
  # forward-pass cross-path oracles with what is left
  for pass in kernels forward; do
    left=$(left)
    [ "$left" -gt 30 ] || { stamp "tests ($pass): no time left"; continue; }
    sel=(--ignore=tests/test_forward_oracles.py); [ $pass = forward ] && sel=(tests/test_forward_oracles.py)
    stamp "tests ($pass, pytest -m gpu), ${left} s left"
    timeout -s INT "$left" python3 -m pytest -q -m gpu -n 15 --dist loadgroup -p no:cacheprovider --maxfail=30 \
      --continue-on-collection-errors "${sel[@]}" > "$OUT/tests-$pass.log" 2>&1
    stamp "tests ($pass) exit $?"
    grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests-$pass.log" | tail -25
  done
fi
pack
if [ "$DRY" = 1 ]; then
  stamp "dry run: $dry_checked bench commands checked, $dry_failed failed"
  [ "$dry_failed" = 0 ]; exit
fi
stamp "done"
