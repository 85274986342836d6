// Kernels that must fail cleanly: deadlocks, strict-mode violations, a crash.
// MARK comments let the tests find the line numbers they expect in messages.

extern "C" __global__ void shfl_after_exit(float* out) {
    float v = out[threadIdx.x];
    if ((threadIdx.x & 31) >= 16) return;
    v += __shfl_down_sync(0xffffffff, v, 1);  // MARK:shfl_after_exit
    out[threadIdx.x] = v;
}

extern "C" __global__ void barrier_vs_shuffle(float* out) {
    float v = out[threadIdx.x];
    if (threadIdx.x < 16) {
        __syncthreads();  // MARK:bvs_barrier
    } else {
        v = __shfl_xor_sync(0xffffffff, v, 1);  // MARK:bvs_shfl
    }
    out[threadIdx.x] = v;
}

extern "C" __global__ void early_exit(float* out) {
    if (threadIdx.x == 5) return;
    __syncthreads();  // MARK:early_exit
    out[threadIdx.x] = 1.0f;
}

extern "C" __global__ void partial_shuffle(float* out) {
    float v = out[threadIdx.x];
    if ((threadIdx.x & 31) < 16) v = __shfl_down_sync(0x0000ffff, v, 1, 16);  // MARK:partial
    out[threadIdx.x] = v;
}

extern "C" __global__ void divergent_barriers(float* out) {
    if (threadIdx.x < 8) {
        __syncthreads();  // MARK:div_a
    } else {
        __syncthreads();  // MARK:div_b
    }
    out[threadIdx.x] = 2.0f;
}

extern "C" __global__ void out_of_bounds(float* out) {
    out[threadIdx.x + (1ll << 40)] = 1.0f;
}

extern "C" __global__ void trap_on_negative(const float* x) {
    if (x[threadIdx.x] < 0.0f) __trap();
}

extern "C" __global__ void assert_positive(const float* x) {
    assert(x[threadIdx.x] > 0.0f);  // MARK:assert
}
