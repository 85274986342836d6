// matmul.cu -- Y = X @ W^T (+ bias) with W in any GGML type, dequantized in the kernel.
//   matmul_<type>(W, X, bias, Y, n_tokens, n_out, n_in, has_bias)
//     W     raw GGUF bytes, n_out rows of row_bytes(type, n_in) bytes (no alignment needed)
//     X     float[n_tokens][n_in], row-major, 16-byte aligned (any allocation or row of one)
//     bias  float[n_out], read only when has_bias != 0 (any valid pointer otherwise)
//     Y     float[n_tokens][n_out], row-major
//     n_in  a multiple of 32 (of 256 for the K-quants); n_out, n_tokens >= 1, any value
//   <type>: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k. N = 1 (matvec) is the same kernel.
//
// Launch: block = 32 * R threads (R warps, one output row each; 128 suggested),
//         grid = (ceil(n_out / R), ceil(n_tokens / 8)).
//
// Design: a warp owns one output row and one tile of up to MM_TILE = 8 tokens. Lane l
// walks the row's 32-value chunks l, l+32, l+64, ...: it decodes a chunk into 32
// registers once and folds it into one accumulator per token of the tile
// (acc = fma(w, x, acc) in value order). The 32 lane partials of the 8 tokens are then
// reduced by a reduce-scatter butterfly (offsets 16, 8, 4 halve the values each lane
// holds; 2 and 1 finish): 9 shuffles instead of 8 x 5, no shared memory, no barriers.
//
// Batch invariance (a hard requirement): the arithmetic of Y[t][r] -- which lane takes
// which values, the fma order, the pairing tree (l, l^16), (l, l^8), ... of the lanes --
// depends only on n_in and the lane, never on n_tokens or on t's slot in its tile
// (float addition is commutative, so which side of a pair a lane sits on does not
// matter). So a token's output is bit-identical alone or packed with any others, and
// whatever R the launcher picks. The fma is explicit so no compiler contraction choice
// can differ between tile slots.
#include "ggml_blocks.cuh"

#define MM_TILE 8

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

// One step of the reduce-scatter: each lane holds 2K values (slots); the lane whose
// `off` bit is set keeps the upper K, its partner the lower K, each adding the other's.
template <int K>
__device__ __forceinline__ void mm_scatter_step(float (&v)[MM_TILE], int off, bool upper) {
#pragma unroll
    for (int i = 0; i < K; ++i) {
        const float send = upper ? v[i] : v[i + K];
        const float keep = upper ? v[i + K] : v[i];
        v[i] = keep + __shfl_xor_sync(SHARPINF_FULL_MASK, send, off);
    }
}

template <int QT>
__device__ __forceinline__ void matmul_rows(const unsigned char* __restrict__ W, const float* __restrict__ X,
                                            const float* __restrict__ bias, float* __restrict__ Y, int n_tokens,
                                            int n_out, int n_in, int has_bias) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= n_out) return;  // the whole warp leaves together; there are no block barriers
    const int t0 = blockIdx.y * MM_TILE;
    const int nt = n_tokens - t0 < MM_TILE ? n_tokens - t0 : MM_TILE;  // tokens in this tile
    const unsigned char* wrow = W + (long long)row * gb_row_bytes<QT>(n_in);
    const float* xt = X + (long long)t0 * n_in;
    const int n_chunks = n_in / GB_CHUNK;

    float acc[MM_TILE];
#pragma unroll
    for (int t = 0; t < MM_TILE; ++t) acc[t] = 0.0f;

    for (int c = lane; c < n_chunks; c += 32) {
        float w[32];
        gb_decode_chunk<QT>(wrow, c, w);
#pragma unroll
        for (int t = 0; t < MM_TILE; ++t) {
            if (t < nt) {
                float x[32];
                mm_load_x32(x, xt + (long long)t * n_in + (long long)c * GB_CHUNK);
                float a = acc[t];
#pragma unroll
                for (int e = 0; e < 32; ++e) a = gb_fma(w[e], x[e], a);
                acc[t] = a;
            }
        }
    }

    // Reduce-scatter: after offsets 16, 8, 4 lane l holds slot (l >> 2) & 7 in acc[0].
    mm_scatter_step<4>(acc, 16, (lane & 16) != 0);
    mm_scatter_step<2>(acc, 8, (lane & 8) != 0);
    mm_scatter_step<1>(acc, 4, (lane & 4) != 0);
    float v = acc[0];
    v += __shfl_xor_sync(SHARPINF_FULL_MASK, v, 2);
    v += __shfl_xor_sync(SHARPINF_FULL_MASK, v, 1);

    const int slot = (lane >> 2) & 7;
    if ((lane & 3) == 0 && slot < nt) {
        if (has_bias) v += bias[row];
        Y[(long long)(t0 + slot) * n_out + row] = v;
    }
}

// The entry points, one per type (written out: the emulator's launcher reads these signatures).
extern "C" __global__ void matmul_f32(const unsigned char* W, const float* X, const float* bias, float* Y,
                                      int n_tokens, int n_out, int n_in, int has_bias) {
    matmul_rows<GB_F32>(W, X, bias, Y, n_tokens, n_out, n_in, has_bias);
}
extern "C" __global__ void matmul_f16(const unsigned char* W, const float* X, const float* bias, float* Y,
                                      int n_tokens, int n_out, int n_in, int has_bias) {
    matmul_rows<GB_F16>(W, X, bias, Y, n_tokens, n_out, n_in, has_bias);
}
extern "C" __global__ void matmul_bf16(const unsigned char* W, const float* X, const float* bias, float* Y,
                                      int n_tokens, int n_out, int n_in, int has_bias) {
    matmul_rows<GB_BF16>(W, X, bias, Y, n_tokens, n_out, n_in, has_bias);
}
extern "C" __global__ void matmul_q8_0(const unsigned char* W, const float* X, const float* bias, float* Y,
                                      int n_tokens, int n_out, int n_in, int has_bias) {
    matmul_rows<GB_Q8_0>(W, X, bias, Y, n_tokens, n_out, n_in, has_bias);
}
extern "C" __global__ void matmul_q4_0(const unsigned char* W, const float* X, const float* bias, float* Y,
                                      int n_tokens, int n_out, int n_in, int has_bias) {
    matmul_rows<GB_Q4_0>(W, X, bias, Y, n_tokens, n_out, n_in, has_bias);
}
extern "C" __global__ void matmul_q4_1(const unsigned char* W, const float* X, const float* bias, float* Y,
                                      int n_tokens, int n_out, int n_in, int has_bias) {
    matmul_rows<GB_Q4_1>(W, X, bias, Y, n_tokens, n_out, n_in, has_bias);
}
extern "C" __global__ void matmul_q5_0(const unsigned char* W, const float* X, const float* bias, float* Y,
                                      int n_tokens, int n_out, int n_in, int has_bias) {
    matmul_rows<GB_Q5_0>(W, X, bias, Y, n_tokens, n_out, n_in, has_bias);
}
extern "C" __global__ void matmul_q5_1(const unsigned char* W, const float* X, const float* bias, float* Y,
                                      int n_tokens, int n_out, int n_in, int has_bias) {
    matmul_rows<GB_Q5_1>(W, X, bias, Y, n_tokens, n_out, n_in, has_bias);
}
extern "C" __global__ void matmul_q4_k(const unsigned char* W, const float* X, const float* bias, float* Y,
                                      int n_tokens, int n_out, int n_in, int has_bias) {
    matmul_rows<GB_Q4_K>(W, X, bias, Y, n_tokens, n_out, n_in, has_bias);
}
extern "C" __global__ void matmul_q5_k(const unsigned char* W, const float* X, const float* bias, float* Y,
                                      int n_tokens, int n_out, int n_in, int has_bias) {
    matmul_rows<GB_Q5_K>(W, X, bias, Y, n_tokens, n_out, n_in, has_bias);
}
extern "C" __global__ void matmul_q6_k(const unsigned char* W, const float* X, const float* bias, float* Y,
                                      int n_tokens, int n_out, int n_in, int has_bias) {
    matmul_rows<GB_Q6_K>(W, X, bias, Y, n_tokens, n_out, n_in, has_bias);
}
