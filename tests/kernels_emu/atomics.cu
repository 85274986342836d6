// Atomics under contention, a CAS loop, and the half/bf16 stand-in math.

extern "C" __global__ void atomic_counts(int* ci, unsigned* cu, unsigned long long* cl, float* cf, double* cd) {
    atomicAdd(ci, 1);
    atomicAdd(cu, 2u);
    atomicAdd(cl, 3ull);
    atomicAdd(cf, 1.0f);
    atomicAdd(cd, 0.5);
    atomicMax(ci + 1, (int)(blockIdx.x * blockDim.x + threadIdx.x));
    atomicMin(ci + 2, -(int)threadIdx.x);
}

// Float max through atomicCAS, the portable idiom (CUDA has no float atomicMax).
__device__ float atomic_max_float(float* addr, float v) {
    int* p = reinterpret_cast<int*>(addr);
    int old = *p, assumed;
    do {
        assumed = old;
        if (__int_as_float(assumed) >= v) break;
        old = atomicCAS(p, assumed, __float_as_int(v));
    } while (old != assumed);
    return __int_as_float(old);
}

extern "C" __global__ void cas_max(const float* x, float* m, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomic_max_float(m, x[i]);
}

extern "C" __global__ void half_math(const __half* x, __half* y, __nv_bfloat16* z, float* f) {
    int i = threadIdx.x;
    __half h = x[i];
    y[i] = __hfma(hexp(h), __float2half(2.0f), __float2half(1.0f));
    z[i] = __float2bfloat16(__bfloat162float(hsqrt(__float2bfloat16(__half2float(h) + 4.0f))));
    __half2 p = __halves2half2(h, h);
    float2 q = __half22float2(__hmul2(p, p));
    f[i] = q.x + q.y + __expf(0.0f) + rsqrtf(4.0f) + __fdividef(1.0f, 4.0f) + __saturatef(3.0f) +
           (CUDART_INF_F > 1e30f ? 1.0f : 0.0f) + __ldg(&f[i]);
}

template <typename T>
__global__ void scale_t(T* x, T a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
}
