// Non-portable: CUDA has no atomicMax for float, so this must not compile.
extern "C" __global__ void float_max(float* m, const float* x) {
    atomicMax(m, x[threadIdx.x]);
}
