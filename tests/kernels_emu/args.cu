// Every scalar kind the Python side packs, written back for checking.
extern "C" __global__ void store_args(double* out, int i, unsigned u, float f, long long l, double d,
                                      unsigned long long q, short s, unsigned char c) {
    out[0] = i; out[1] = u; out[2] = f; out[3] = (double)l; out[4] = d; out[5] = (double)q;
    out[6] = s; out[7] = c;
}
extern "C" __global__ void add_scalar(float* x, float v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += v;
}
