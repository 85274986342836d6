// mma_frag.cuh -- the tensor-core primitives and their fragment layouts: mma_m16n8k16_f16_f32,
// mma_m16n8k32_s8_s32 and ldmatrix_x4. Each has a PTX branch and an emulated one that follows the
// PTX fragment layout exactly (emu_shims.cuh), so the indexing a kernel relies on runs on the CPU too.
#pragma once
#include "emu_shims.cuh"

// D(16x8,f32) = A(16x16,f16,row) * B(16x8,f16,col) + C, one warp, all 32 lanes.
// Fragment layout (PTX ISA, mma.m16n8k16 .f16): g = lane>>2, t = lane%4; a register
// holds two halves, the lower-indexed element in the low 16 bits.
//   a[0] = A[g][2t..2t+1]    a[1] = A[g+8][2t..2t+1]
//   a[2] = A[g][2t+8..2t+9]  a[3] = A[g+8][2t+8..2t+9]
//   b[0] = B[2t..2t+1][g]    b[1] = B[2t+8..2t+9][g]
//   c/d[0..1] = C[g][2t..2t+1]   c/d[2..3] = C[g+8][2t..2t+1]
// d may alias c.
__device__ __forceinline__ void mma_m16n8k16_f16_f32(float (&d)[4], const unsigned (&a)[4],
                                                     const unsigned (&b)[2], const float (&c)[4]) {
#ifndef SHARPINF_EMU
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
          "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
#else
    const SharpinfEmuD4<float> r = sharpinf_emu_mma<true>(a[0], a[1], a[2], a[3], b[0], b[1], c[0], c[1], c[2], c[3]);
    for (int i = 0; i < 4; ++i) d[i] = r.v[i];
#endif
}

// D(16x8,s32) = A(16x32,s8,row) * B(32x8,s8,col) + C, one warp: the int8 tensor-core product,
// exact (int32 accumulation). Fragment layout (PTX ISA, mma.m16n8k32 .s8): g = lane>>2,
// t = lane%4; a register holds four int8, the lower-indexed element in the low byte.
//   a[0] = A[g][4t..4t+3]      a[1] = A[g+8][4t..4t+3]
//   a[2] = A[g][4t+16..4t+19]  a[3] = A[g+8][4t+16..4t+19]
//   b[0] = B[4t..4t+3][g]      b[1] = B[4t+16..4t+19][g]
//   c/d[0..1] = C[g][2t..2t+1]   c/d[2..3] = C[g+8][2t..2t+1]
// (tests/test_ptx_layouts.py checks this against the ISA's tables, written there as data.)
__device__ __forceinline__ void mma_m16n8k32_s8_s32(int (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                                                    const int (&c)[4]) {
#ifndef SHARPINF_EMU
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
          "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]));
#else
    const SharpinfEmuD4<int> r = sharpinf_emu_mma<false>(a[0], a[1], a[2], a[3], b[0], b[1], c[0], c[1], c[2], c[3]);
    for (int i = 0; i < 4; ++i) d[i] = r.v[i];
#endif
}

// --- ldmatrix ---------------------------------------------------------------------------
// ldmatrix.sync.aligned.m8n8.x4.shared.b16: four 8x8 b16 matrices from shared memory.
// Lane l supplies the address of row (l%8) of matrix (l/8) (16 contiguous bytes, 16-byte
// aligned). Result: r[i] of lane l = matrix i, row l>>2, elements 2*(l%4) and 2*(l%4)+1.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* smem_row) {
#ifndef SHARPINF_EMU
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem_row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
#else
    const int lane = threadIdx.x & 31;
    const unsigned char* all = sharpinf_emu_warp_share(&smem_row, sizeof smem_row);  // every lane's row address
    for (int i = 0; i < 4; ++i) {
        const int src = i * 8 + (lane >> 2);  // the lane that holds this row's address
        const unsigned char* row;
        __builtin_memcpy(&row, all + ::sharpinf_emu::SHARE_STRIDE * src, sizeof row);
        unsigned v;
        __builtin_memcpy(&v, row + 4 * (lane & 3), 4);
        r[i] = v;
    }
#endif
}
