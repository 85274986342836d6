// rmsnorm_q8_1.cu -- variant of rmsnorm.cu for the dp4a path: the normalised row goes straight
// to q8_1, the activation format matmul_dp4a.cu reads, so a step quantizes each activation once.
//
//   rmsnorm_q8_1(x, w, q, d, s, n, eps)   q8_1( x * rsqrt(mean(x^2) + eps) * w )
//   quantize_q8_1(x, q, d, s, n)          q8_1( x )            (activations no norm precedes)
//     x  float [rows, n]; w float [n]; n a multiple of 32
//     q  int8  [rows, n]        block b of a row = values 32b..32b+31
//     d  float [rows, n/32]     the block's scale: amax / 127
//     s  int   [rows, n/32]     the block's sum of q (for the weight types with an offset)
//   value = d * q, q = roundf(v / d) computed as roundf(v * (1/d)) (0 when the block is all zero)
//   -- the same rule as the NumPy reference (sharpinf/ops/quant_act.py), bit for bit.
//
// Algorithm: one block per row. The sum of squares is rmsnorm.cu's, same block size (the
// launcher's choice depends on n only), so the normalised values equal rmsnorm_f32's bits; then
// each warp takes 32-value blocks w, w + warps, ...: lane l holds value 32b + l, the warp's max
// and int sum are xor-butterfly shuffles (fixed order), lane 0 writes d and s.
// Launch: rmsnorm_q8_1 grid = rows, block = 128 (n <= 256), 256 (n <= 2048) or 1024 threads;
// quantize_q8_1 grid = (rows, n / 2048 rounded up), block = 512 threads.
// Batch invariance: a row's arithmetic depends on the row and n only (the block size is n's), and
// a q8_1 block's on its 32 values only.
// Bound: memory -- reads 4n bytes, writes ~1.3n; a few us per step, one launch per norm.
#include "q8_1_rows.cuh"

// The sum of squares is rmsnorm.cu's whatever the block size (q8_1_rows.cuh's rms_scale), so the
// normalised values equal rmsnorm_f32's bits; a block larger than rmsnorm's only helps quantize.
extern "C" __global__ void rmsnorm_q8_1(const float* x, const float* w, signed char* q, float* d, int* s, int n,
                                        float eps) {
    sharpinf_pdl_enter();
    __shared__ float smem32[32];
    const long long row = blockIdx.x;
    rmsnorm_q8_1_row(x + row * n, w, q + row * n, d + row * (n / 32), s + row * (n / 32), n, eps, smem32);
}

// grid = (rows, chunks of RQ_CHUNK blocks): no reduction across the row, so a long row spreads
// over several blocks.
#define RQ_CHUNK 64
extern "C" __global__ void quantize_q8_1(const float* x, signed char* q, float* d, int* s, int n) {
    sharpinf_pdl_enter();
    const long long row = blockIdx.x;
    x += row * n;
    const int b_begin = blockIdx.y * RQ_CHUNK, b_end = min(n / 32, b_begin + RQ_CHUNK);
    q8_1_row([&](int i) { return x[i]; }, q + row * n, d + row * (n / 32), s + row * (n / 32), b_begin, b_end);
}
