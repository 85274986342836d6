// embedding.cu -- embedding gather from quantized rows: out[t] = dequantize(W row ids[t]) * scale.
//   embed_<type>(W, ids, out, n_tokens, n_embd, scale, feed_rows, feed_ids)
//     W    raw GGUF bytes, one row of row_bytes(type, n_embd) bytes per vocabulary entry
//     ids  int32[n_tokens], each a valid row index (not checked here)
//     feed_rows int32[n_tokens]: -1, or the row r of feed_ids that holds token t's id (a token
//          scheduled before the previous step's sampled id reached the host: ids[t] is a
//          placeholder). The id feed_ids[r] is used and written back into ids[t], so the step's
//          token_ids end up real. feed_ids: the previous step's sampled ids (int32, on the device).
//     out  float[n_tokens][n_embd], row-major
//     n_embd a multiple of the block size (32, or 256 for the K-quants); any value for f32/f16/bf16
//     scale  float multiplier of every value (1 for most models; gemma3: sqrt(n_embd), as llama.cpp's
//            ggml_scale after the gather: one float product per value)
//   <type>: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k, and q2_k q3_k iq4_nl iq4_xs mxfp4.
// Values equal quants.dequantize's exactly (see ggml_blocks.cuh), times scale (x * 1 = x).
// Launch: grid = (n_tokens, G), any G >= 1 (1 is enough); block = any multiple of 32 (128 suggested).
//   Block (t, g) writes row t; its threads stride over the row's 32-value chunks (quantized
//   types) or values (float types).
// Batch invariance: row t is a function of W's row ids[t] and scale only.
// Bound: memory -- a row's bytes read, 4 n_embd written, per token.
#include "ggml_blocks.cuh"

template <int QT>
__device__ __forceinline__ void embed_row(const unsigned char* __restrict__ W, int* __restrict__ ids,
                                          float* __restrict__ out, int n_tokens, int n_embd, float scale,
                                          const int* __restrict__ feed_rows, const int* __restrict__ feed_ids) {
    const int t = blockIdx.x;
    if (t >= n_tokens) return;
    // A fed token reads feed_ids, never ids[t], which one thread then overwrites with it.
    const int fr = feed_rows[t];
    const int id = fr >= 0 ? feed_ids[fr] : ids[t];
    if (fr >= 0 && blockIdx.y == 0 && threadIdx.x == 0) ids[t] = id;
    const unsigned char* row = W + (long long)id * gb_row_bytes<QT>(n_embd);
    float* o = out + (long long)t * n_embd;
    const int first = blockIdx.y * blockDim.x + threadIdx.x, stride = gridDim.y * blockDim.x;
    if constexpr (GbInfo<QT>::elems == 1) {
        for (int i = first; i < n_embd; i += stride) o[i] = gb_decode_value<QT>(row, i) * scale;
    } else {
        for (int c = first; c < n_embd / GB_CHUNK; c += stride) {
            float w[32];
            gb_decode_chunk<QT>(row, c, w);
#pragma unroll
            for (int e = 0; e < 32; ++e) o[(long long)c * GB_CHUNK + e] = w[e] * scale;
        }
    }
}

// (if constexpr: gb_decode_value exists for the float types only.)
// The entry points, one per type.
extern "C" __global__ void embed_f32(const unsigned char* W, int* ids, float* out, int n_tokens, int n_embd, float scale,
                                    const int* feed_rows, const int* feed_ids) {
    sharpinf_pdl_enter();
    embed_row<GB_F32>(W, ids, out, n_tokens, n_embd, scale, feed_rows, feed_ids);
}
extern "C" __global__ void embed_f16(const unsigned char* W, int* ids, float* out, int n_tokens, int n_embd, float scale,
                                    const int* feed_rows, const int* feed_ids) {
    sharpinf_pdl_enter();
    embed_row<GB_F16>(W, ids, out, n_tokens, n_embd, scale, feed_rows, feed_ids);
}
extern "C" __global__ void embed_bf16(const unsigned char* W, int* ids, float* out, int n_tokens, int n_embd, float scale,
                                    const int* feed_rows, const int* feed_ids) {
    sharpinf_pdl_enter();
    embed_row<GB_BF16>(W, ids, out, n_tokens, n_embd, scale, feed_rows, feed_ids);
}
extern "C" __global__ void embed_q8_0(const unsigned char* W, int* ids, float* out, int n_tokens, int n_embd, float scale,
                                    const int* feed_rows, const int* feed_ids) {
    sharpinf_pdl_enter();
    embed_row<GB_Q8_0>(W, ids, out, n_tokens, n_embd, scale, feed_rows, feed_ids);
}
extern "C" __global__ void embed_q4_0(const unsigned char* W, int* ids, float* out, int n_tokens, int n_embd, float scale,
                                    const int* feed_rows, const int* feed_ids) {
    sharpinf_pdl_enter();
    embed_row<GB_Q4_0>(W, ids, out, n_tokens, n_embd, scale, feed_rows, feed_ids);
}
extern "C" __global__ void embed_q4_1(const unsigned char* W, int* ids, float* out, int n_tokens, int n_embd, float scale,
                                    const int* feed_rows, const int* feed_ids) {
    sharpinf_pdl_enter();
    embed_row<GB_Q4_1>(W, ids, out, n_tokens, n_embd, scale, feed_rows, feed_ids);
}
extern "C" __global__ void embed_q5_0(const unsigned char* W, int* ids, float* out, int n_tokens, int n_embd, float scale,
                                    const int* feed_rows, const int* feed_ids) {
    sharpinf_pdl_enter();
    embed_row<GB_Q5_0>(W, ids, out, n_tokens, n_embd, scale, feed_rows, feed_ids);
}
extern "C" __global__ void embed_q5_1(const unsigned char* W, int* ids, float* out, int n_tokens, int n_embd, float scale,
                                    const int* feed_rows, const int* feed_ids) {
    sharpinf_pdl_enter();
    embed_row<GB_Q5_1>(W, ids, out, n_tokens, n_embd, scale, feed_rows, feed_ids);
}
extern "C" __global__ void embed_q4_k(const unsigned char* W, int* ids, float* out, int n_tokens, int n_embd, float scale,
                                    const int* feed_rows, const int* feed_ids) {
    sharpinf_pdl_enter();
    embed_row<GB_Q4_K>(W, ids, out, n_tokens, n_embd, scale, feed_rows, feed_ids);
}
extern "C" __global__ void embed_q5_k(const unsigned char* W, int* ids, float* out, int n_tokens, int n_embd, float scale,
                                    const int* feed_rows, const int* feed_ids) {
    sharpinf_pdl_enter();
    embed_row<GB_Q5_K>(W, ids, out, n_tokens, n_embd, scale, feed_rows, feed_ids);
}
extern "C" __global__ void embed_q6_k(const unsigned char* W, int* ids, float* out, int n_tokens, int n_embd, float scale,
                                    const int* feed_rows, const int* feed_ids) {
    sharpinf_pdl_enter();
    embed_row<GB_Q6_K>(W, ids, out, n_tokens, n_embd, scale, feed_rows, feed_ids);
}
extern "C" __global__ void embed_q2_k(const unsigned char* W, int* ids, float* out, int n_tokens, int n_embd, float scale,
                                    const int* feed_rows, const int* feed_ids) {
    sharpinf_pdl_enter();
    embed_row<GB_Q2_K>(W, ids, out, n_tokens, n_embd, scale, feed_rows, feed_ids);
}
extern "C" __global__ void embed_q3_k(const unsigned char* W, int* ids, float* out, int n_tokens, int n_embd, float scale,
                                    const int* feed_rows, const int* feed_ids) {
    sharpinf_pdl_enter();
    embed_row<GB_Q3_K>(W, ids, out, n_tokens, n_embd, scale, feed_rows, feed_ids);
}
extern "C" __global__ void embed_iq4_nl(const unsigned char* W, int* ids, float* out, int n_tokens, int n_embd, float scale,
                                    const int* feed_rows, const int* feed_ids) {
    sharpinf_pdl_enter();
    embed_row<GB_IQ4_NL>(W, ids, out, n_tokens, n_embd, scale, feed_rows, feed_ids);
}
extern "C" __global__ void embed_iq4_xs(const unsigned char* W, int* ids, float* out, int n_tokens, int n_embd, float scale,
                                    const int* feed_rows, const int* feed_ids) {
    sharpinf_pdl_enter();
    embed_row<GB_IQ4_XS>(W, ids, out, n_tokens, n_embd, scale, feed_rows, feed_ids);
}
extern "C" __global__ void embed_mxfp4(const unsigned char* W, int* ids, float* out, int n_tokens, int n_embd, float scale,
                                    const int* feed_rows, const int* feed_ids) {
    sharpinf_pdl_enter();
    embed_row<GB_MXFP4>(W, ids, out, n_tokens, n_embd, scale, feed_rows, feed_ids);
}
