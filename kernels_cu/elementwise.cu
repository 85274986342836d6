// elementwise.cu -- pointwise ops over flat, contiguous arrays of n elements.
//   add_f32(a, b, out, n):           out[i] = a[i] + b[i]
//   silu_gate_f32(gate, up, out, n): out[i] = silu(gate[i]) * up[i], silu(x) = x / (1 + e^-x)
//   gelu_gate_f32(gate, up, out, n): out[i] = gelu(gate[i]) * up[i], GELU's tanh form (gemma3)
//   softcap_f32(x, n, cap):          x[i] = cap * tanh(x[i] / cap), in place (final-logit softcapping)
// n is int32; out may alias an input.
// Launch: 1-D, any grid and block (256 threads suggested); grid-stride loop, so
// grid = min(ceil(n / 256), a few per SM) is enough.
// Batch invariance: pointwise -- element i depends on element i of the inputs only.
// Bound: memory -- 12 bytes an element (8 for softcap).
#include "common.cuh"

struct AddOp { __device__ __forceinline__ float operator()(float a, float b) const { return a + b; } };
struct SiluGateOp {
    __device__ __forceinline__ float operator()(float g, float u) const { return gated_act(ACT_SILU, g, u); }
};
struct GeluGateOp {
    __device__ __forceinline__ float operator()(float g, float u) const { return gated_act(ACT_GELU_TANH, g, u); }
};

template <typename T, typename Op>
__device__ __forceinline__ void map2(const T* a, const T* b, T* out, int n) {  // no __restrict__: out may alias
    const Op op;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = from_float<T>(op(to_float(a[i]), to_float(b[i])));
}

extern "C" __global__ void add_f32(const float* a, const float* b, float* out, int n) {
    sharpinf_pdl_enter();
    map2<float, AddOp>(a, b, out, n);
}
extern "C" __global__ void silu_gate_f32(const float* gate, const float* up, float* out, int n) {
    sharpinf_pdl_enter();
    map2<float, SiluGateOp>(gate, up, out, n);
}

extern "C" __global__ void gelu_gate_f32(const float* gate, const float* up, float* out, int n) {
    sharpinf_pdl_enter();
    map2<float, GeluGateOp>(gate, up, out, n);
}
extern "C" __global__ void softcap_f32(float* x, int n, float cap) {
    sharpinf_pdl_enter();
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) x[i] = sharpinf_softcap(x[i], cap);
}
