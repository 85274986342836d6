// mma_rows.cuh -- the row loop matmul_mma.cu and gate_up_mma.cu share: Y = X W^T on int8 tensor cores
// (mma.m16n8k32.s8), bit-identical to matmul_dp4a.cu / gate_up_dp4a.cu.
//   mma_rows<QT, NMAT>(...)   a block's 64 rows x 16 tokens (NMAT = 2: the gate and up pair)
// Algorithm, tiles, launch and bound: matmul_mma.cu's header.
#pragma once
#include "dp4a.cuh"

#define MM_WARPS 4    // warps per block; a warp owns 16 weight rows
#define MM_TOKENS 16  // tokens per block: two n8 tiles

// r = w[k] for a run-time k without a run-time register index (which would go to local memory)
__device__ __forceinline__ int mm_pick(const int (&w)[8], int k) {
    int r = w[0];
#pragma unroll
    for (int u = 1; u < 8; ++u)
        if (u == k) r = w[u];
    return r;
}

// The activation tile of one 32-value chunk: the block's 16 tokens' q8_1 blocks (int8 values, d, s),
// shared by the block's 4 warps. Rows padded to 48 bytes: ldmatrix's 8 row reads hit 8 distinct
// bank quads. Tokens past the last are zeros.
#define MM_XROW 12  // ints a staged row (8 used)
struct MmXTile {
    int q[MM_TOKENS][MM_XROW];
    float d[MM_TOKENS];
    int s[MM_TOKENS];
};

// Stage chunk c of the block's tokens n0.. into tile: the values by cp.async (32 threads, 16 bytes
// each), d and s by plain loads (16 threads). Visible after cp_async_wait_all() and a barrier.
__device__ __forceinline__ void mm_stage_x(MmXTile& tile, const signed char* xq, const float* xd, const int* xs,
                                           int n0, int n_tokens, int n_in, int c) {
    const int tid = threadIdx.x, n_chunks = n_in / 32;
    if (tid < 2 * MM_TOKENS) {
        const int tk = tid >> 1, half = tid & 1;
        int* dst = &tile.q[tk][4 * half];
        if (n0 + tk < n_tokens) cp_async_16(dst, xq + (long long)(n0 + tk) * n_in + 32LL * c + 16 * half);
        else *reinterpret_cast<int4*>(dst) = make_int4(0, 0, 0, 0);
    } else if (tid < 3 * MM_TOKENS) {
        const int tk = tid - 2 * MM_TOKENS;
        const bool live = n0 + tk < n_tokens;
        tile.d[tk] = live ? xd[(long long)(n0 + tk) * n_chunks + c] : 0.0f;
        tile.s[tk] = live ? xs[(long long)(n0 + tk) * n_chunks + c] : 0;
    }
    cp_async_commit();
}

// NMAT = 1: Y = X W^T (+ bias) (+ Y when accumulate).   NMAT = 2: Y = act(X W^T) * (X W2^T).
template <int QT, int NMAT>
__device__ __forceinline__ void mma_rows(const unsigned char* __restrict__ W, const unsigned char* __restrict__ W2,
                                         const signed char* __restrict__ xq, const float* __restrict__ xd,
                                         const int* __restrict__ xs, const float* __restrict__ bias, float* Y,
                                         int n_tokens, int n_out, int n_in, int has_bias, int accumulate,
                                         long long y_stride, int act = ACT_SILU) {
    constexpr bool HALVES = QT == GB_Q6_K;  // Q6_K scales 16-value halves: their dots separately
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int n_chunks = n_in / 32;
    const int G = dp_group_lanes(n_chunks);
    __shared__ __align__(16) MmXTile xtile[2];  // double buffer: chunk k's tile in use, k + 1's loading
    const int r0 = (blockIdx.x * MM_WARPS + warp) * 16, n0 = blockIdx.y * MM_TOKENS;
    const int row[2] = {r0 + g, r0 + g + 8};  // this lane's rows: C elements 0,1 and 2,3
    const long long row_bytes = gb_row_bytes<QT>(n_in);
    const unsigned char* mats[2] = {W, NMAT > 1 ? W2 : W};

    // the canonical order (dp4a.cuh): member gp's sum of chunks gp, gp + G, ... (part), the
    // member sums of a group in member order (grp), the group sums in group order (total) --
    // three floats per output
    const int GS = dp_group_size(G);
    float grp[NMAT][8], total[NMAT][8];
#pragma unroll
    for (int m = 0; m < NMAT; ++m)
#pragma unroll
        for (int e = 0; e < 8; ++e) grp[m][e] = total[m][e] = 0.0f;

    // every warp walks the same chunks in the same order: gp = 0, 1, ..., G - 1, then c = gp, gp + G, ...
    // (G <= n_chunks, so every gp has a chunk); the tile of the next chunk loads during this one's mmas
    mm_stage_x(xtile[0], xq, xd, xs, n0, n_tokens, n_in, 0);
    int k = 0;  // chunks done
    for (int gp = 0; gp < G; ++gp) {
        float part[NMAT][8];
#pragma unroll
        for (int m = 0; m < NMAT; ++m)
#pragma unroll
            for (int e = 0; e < 8; ++e) part[m][e] = 0.0f;
        for (int c = gp; c < n_chunks; c += G, ++k) {
            cp_async_wait_all();
            __syncthreads();  // chunk c's tile is in; every warp is done with the other buffer
            {
                const int nc = c + G < n_chunks ? c + G : (gp + 1 < G ? gp + 1 : -1);
                if (nc >= 0) mm_stage_x(xtile[(k + 1) & 1], xq, xd, xs, n0, n_tokens, n_in, nc);
            }
            const MmXTile& xt = xtile[k & 1];
            unsigned bx[4];  // B fragments of both n8 tiles: tokens g and 8 + g, words t and 4 + t
            ldmatrix_x4(bx, &xt.q[(lane & 7) + ((lane >> 4) & 1) * 8][((lane >> 3) & 1) * 4]);
            DpChunk<QT> ch[NMAT][2];
            unsigned a[NMAT][4], alo[NMAT][4];
#pragma unroll
            for (int m = 0; m < NMAT; ++m) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    ch[m][h] = DpChunk<QT>{};
                    if (row[h] < n_out) ch[m][h].load(mats[m] + (long long)row[h] * row_bytes, c);
                }
                // A fragment: rows g, g+8 x values 4t..4t+3 (a[0], a[1]) and 16+4t.. (a[2], a[3])
                a[m][0] = (unsigned)mm_pick(ch[m][0].w, t);
                a[m][1] = (unsigned)mm_pick(ch[m][1].w, t);
                a[m][2] = (unsigned)mm_pick(ch[m][0].w, 4 + t);
                a[m][3] = (unsigned)mm_pick(ch[m][1].w, 4 + t);
                alo[m][0] = a[m][0];
                alo[m][1] = a[m][1];
                alo[m][2] = alo[m][3] = 0u;  // values 16..31 zeroed: the dot of the first half
            }
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
                const unsigned b[2] = {bx[2 * nt], bx[2 * nt + 1]};
                int s0[2];
                DpXF xf[2];
#pragma unroll
                for (int j = 0; j < 2; ++j) {  // the C fragment's tokens 2t, 2t+1 (tile rows)
                    const int tr = nt * 8 + 2 * t + j;
                    xf[j] = dp_xf(xt.d[tr], xt.s[tr]);
                    s0[j] = 0;
                    if (HALVES) {
                        const int ones[8] = {0x01010101, 0x01010101, 0x01010101, 0x01010101, 0, 0, 0, 0};
                        int xw[8];
#pragma unroll
                        for (int w = 0; w < 8; ++w) xw[w] = w < 4 ? xt.q[tr][w] : 0;
                        s0[j] = dp_dot8(ones, xw);
                    }
                }
                const int zero[4] = {0, 0, 0, 0};
#pragma unroll
                for (int m = 0; m < NMAT; ++m) {
                    int full[4], lo[4] = {0, 0, 0, 0};
                    mma_m16n8k32_s8_s32(full, a[m], b, zero);
                    if (HALVES) mma_m16n8k32_s8_s32(lo, alo[m], b, zero);
#pragma unroll
                    for (int e = 0; e < 4; ++e) {  // C element e: row g + 8 (e >> 1), token 2t + (e & 1)
                        const int j = e & 1;
                        float& acc = part[m][nt * 4 + e];
                        acc = HALVES ? ch[m][e >> 1].acc_idot(acc, lo[e], full[e] - lo[e], xf[j], s0[j])
                                     : ch[m][e >> 1].acc_idot(acc, full[e], 0, xf[j], 0);
                    }
                }
            }
        }
        const bool group_done = (gp + 1) % GS == 0;
#pragma unroll
        for (int m = 0; m < NMAT; ++m)
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                grp[m][e] = grp[m][e] + part[m][e];
                if (group_done) {
                    total[m][e] = total[m][e] + grp[m][e];
                    grp[m][e] = 0.0f;
                }
            }
    }

    // epilogue: dp4a's own (dp_store)
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int r = row[e >> 1], tk = n0 + nt * 8 + 2 * t + (e & 1);
            if (r >= n_out || tk >= n_tokens) continue;
            dp_store<NMAT>(Y + (long long)tk * y_stride + r, total[0][nt * 4 + e], total[NMAT - 1][nt * 4 + e], bias, r,
                           has_bias, accumulate, act);
        }
}
