// matmul.cu -- Y = X @ W^T (+ bias) with W in any GGML type, dequantized in the kernel.
//   matmul_<type>(W, X, bias, Y, n_tokens, n_out, n_in, has_bias)
//     W     raw GGUF bytes, n_out rows of row_bytes(type, n_in) bytes (no alignment needed)
//     X     float[n_tokens][n_in], row-major, 16-byte aligned (any allocation or row of one)
//     bias  float[n_out], read only when has_bias != 0 (any valid pointer otherwise)
//     Y     float[n_tokens][n_out], row-major (matmul_<type>_ys: rows y_stride floats apart)
//     n_in  a multiple of 32 (of 256 for the K-quants); n_out, n_tokens >= 1, any value
//   <type>: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k q2_k q3_k iq4_nl iq4_xs mxfp4. N = 1 (matvec)
//     is the same kernel.
//
// Launch: block = 32 * R threads, R = 1..4 warps (128 suggested); grid = (G, ceil(n_tokens / 8)),
//   any G >= 1: warps stride over groups of 4 rows (G = ceil(n_out / (4 R)) gives each warp one group).
//
// Design: a warp takes 4 output rows and a tile of up to MM_TILE = 8 tokens (grid.y). For
// each row, lane l walks the row's 32-value chunks l, l+32, l+64, ...: it decodes a chunk
// into 32 registers once and folds it into one accumulator per token of the tile
// (acc = fma(w, x, acc) in value order), so weights are read once per token tile. The
// 4 x 8 lane partials go to shared memory; after one __syncwarp lane r*8+t sums output
// (row r, token t) over the 32 lanes in the xor-butterfly order (l with l^16, then l^8,
// ..., l^1). One warp sync per 4 rows, no block barrier, no shuffles (the emulator
// charges each warp sync per lane). On the emulator a full tile runs the same per-token
// fma chains interleaved (emu_shims.cuh's sharpinf_emu_fma_full_tile); the packing tests
// compare it with the partial-tile loop bit for bit.
//
// Batch invariance (a hard requirement): the arithmetic of Y[t][r] -- which lane takes
// which values, the fma order within a lane, the fixed tree over the lanes -- depends
// only on n_in, never on n_tokens, on t's slot in its tile, or on the grid and block
// shape. So a token's output is bit-identical alone or packed with any others. The fma
// is explicit so no compiler contraction choice can differ between tile slots; the
// dequantized weights are exact (ggml_blocks.cuh), so their code order cannot matter.
// Bound: memory at decode (every weight byte once per 8-token tile, as float work on dequantized
// values); the readable baseline, not tuned: the dp4a and tensor-core variants are the fast ones.
#include "ggml_blocks.cuh"

#define MM_TILE 8       // tokens per tile (grid.y)
#define MM_ROWS 4       // rows a warp finishes per pass; MM_ROWS * MM_TILE == 32 (one output per lane)
#define MM_MAX_WARPS 4  // blockDim.x <= 32 * MM_MAX_WARPS

// 32 consecutive floats of X into registers.
__device__ __forceinline__ void mm_load_x32(float (&x)[32], const float* __restrict__ p) {
#ifndef SHARPINF_EMU
    const float4* p4 = reinterpret_cast<const float4*>(p);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const float4 v = p4[i];
        x[4 * i] = v.x;
        x[4 * i + 1] = v.y;
        x[4 * i + 2] = v.z;
        x[4 * i + 3] = v.w;
    }
#else
    for (int e = 0; e < 32; ++e) x[e] = p[e];
#endif
}

// One output per lane: the sum of the 32 lane partials in smem row `p` (p[0..31]), in the
// fixed xor-butterfly order (pairs l, l^16; then l, l^8; ... l, l^1) -- the tree
// warp_reduce_sum would use, done by one lane from shared memory.
__device__ __forceinline__ float mm_tree_sum(const float* p) {
    float v[32];
#pragma unroll
    for (int l = 0; l < 32; ++l) v[l] = p[l];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
#pragma unroll
        for (int l = 0; l < off; ++l) v[l] = v[l] + v[l + off];
    }
    return v[0];
}

template <int QT>
__device__ __forceinline__ void matmul_rows(const unsigned char* __restrict__ W, const float* __restrict__ X,
                                            const float* __restrict__ bias, float* __restrict__ Y, int n_tokens,
                                            int n_out, int n_in, int has_bias, long long y_stride) {
    // Lane partials of MM_ROWS rows x MM_TILE tokens, per warp, double-buffered so one
    // __syncwarp per pass is enough; rows padded to 33 floats (no bank conflicts).
    __shared__ float part[MM_MAX_WARPS][2][MM_ROWS * MM_TILE][33];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int t0 = blockIdx.y * MM_TILE;
    const int nt = n_tokens - t0 < MM_TILE ? n_tokens - t0 : MM_TILE;  // tokens in this tile
    const float* xt = X + (long long)t0 * n_in;
    const long long row_bytes = gb_row_bytes<QT>(n_in);
    const int n_chunks = n_in / GB_CHUNK;
    int buf = 0;
    // Grid-stride over groups of MM_ROWS rows (the launcher may cap the grid).
    for (int row0 = (blockIdx.x * warps + warp) * MM_ROWS; row0 < n_out; row0 += gridDim.x * warps * MM_ROWS) {
        float acc[MM_ROWS][MM_TILE];
#pragma unroll
        for (int r = 0; r < MM_ROWS; ++r) {
#pragma unroll
            for (int t = 0; t < MM_TILE; ++t) acc[r][t] = 0.0f;
            if (row0 + r >= n_out) continue;  // warp-uniform
            const unsigned char* wrow = W + (long long)(row0 + r) * row_bytes;
            for (int c = lane; c < n_chunks; c += 32) {
                float w[32];
                gb_decode_chunk<QT>(wrow, c, w);
                // (the emulator takes a full tile's chains interleaved, the same fmas: emu_shims.cuh)
                if (sharpinf_emu_fma_full_tile(acc[r], w, xt + (long long)c * GB_CHUNK, n_in, nt)) continue;
#pragma unroll
                for (int t = 0; t < MM_TILE; ++t) {
                    if (t < nt) {
                        float x[32];
                        mm_load_x32(x, xt + (long long)t * n_in + (long long)c * GB_CHUNK);
                        float a = acc[r][t];
#pragma unroll
                        for (int e = 0; e < 32; ++e) a = gb_fma(w[e], x[e], a);
                        acc[r][t] = a;
                    }
                }
            }
        }
        float(*pb)[33] = part[warp][buf];
#pragma unroll
        for (int r = 0; r < MM_ROWS; ++r) {
#pragma unroll
            for (int t = 0; t < MM_TILE; ++t) pb[r * MM_TILE + t][lane] = acc[r][t];
        }
        __syncwarp();
        // lane = r * MM_TILE + t finishes output (row0 + r, token t0 + t)
        const int r = lane / MM_TILE, t = lane % MM_TILE, row = row0 + r;
        if (t < nt && row < n_out) {
            float v = mm_tree_sum(pb[lane]);
            if (has_bias) v += bias[row];
            Y[(long long)(t0 + t) * y_stride + row] = v;
        }
        buf ^= 1;  // the next pass writes the other buffer: no second __syncwarp needed
    }
}

// One entry per weight type (GB_ALL_ENTRIES, ggml_blocks.cuh), each compiled only when wanted.
// matmul_<type>_ys is the same with Y rows y_stride floats apart (Y points at the first output
// column), so several matmuls can fill column ranges of one fused buffer.
#define MM_PARAMS const unsigned char *W, const float *X, const float *bias, float *Y, int n_tokens, int n_out, \
        int n_in, int has_bias
template <int QT> __device__ __forceinline__ void matmul_plain(MM_PARAMS) {
    matmul_rows<QT>(W, X, bias, Y, n_tokens, n_out, n_in, has_bias, n_out);
}
template <int QT> __device__ __forceinline__ void matmul_strided(MM_PARAMS, int y_stride) {
    matmul_rows<QT>(W, X, bias, Y, n_tokens, n_out, n_in, has_bias, y_stride);
}
GB_ALL_ENTRIES(matmul, , (MM_PARAMS), matmul_plain, W, X, bias, Y, n_tokens, n_out, n_in, has_bias)
GB_ALL_ENTRIES(matmul, _ys, (MM_PARAMS, int y_stride), matmul_strided, W, X, bias, Y, n_tokens, n_out, n_in, has_bias,
           y_stride)
