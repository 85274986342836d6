// Out-of-bounds accesses for the emulator's memcheck (tests/test_emu_memcheck.py).
// Each kernel is correct for the right arguments; the tests pass arguments that make it
// load or store a few elements past the end or before the start of a buffer.

// out[i] = a[i] + b[i] for i < n + extra: extra > 0 stores past the end of out.
extern "C" __global__ void add_into(const float* a, const float* b, float* out, int n, int extra) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n + extra) out[i] = a[i] + b[i];
}

// x[start + i] = v for i < count: start < 0 stores before the start of x.
extern "C" __global__ void store_range(float* x, int start, int count, float v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) x[start + i] = v;
}

// y[i] = x[i + shift] for i < n: shift != 0 loads past the end (or before the start) of x.
extern "C" __global__ void copy_shift(const float* x, float* y, int n, int shift) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i + shift];
}
