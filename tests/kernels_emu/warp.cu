// Warp shuffles and votes, one kernel per op so the test can compare each
// with its NumPy model. `arg` is srcLane / delta / laneMask.

extern "C" __global__ void shfl_idx(const int* in, int* out, int arg, int width) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    out[t] = __shfl_sync(0xffffffff, in[t], arg, width);
}
extern "C" __global__ void shfl_up(const int* in, int* out, int arg, int width) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    out[t] = __shfl_up_sync(0xffffffff, in[t], arg, width);
}
extern "C" __global__ void shfl_down(const int* in, int* out, int arg, int width) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    out[t] = __shfl_down_sync(0xffffffff, in[t], arg, width);
}
extern "C" __global__ void shfl_xor(const int* in, int* out, int arg, int width) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    out[t] = __shfl_xor_sync(0xffffffff, in[t], arg, width);
}
extern "C" __global__ void votes(const int* pred, unsigned* out) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    int p = pred[t];
    // __activemask is approximate in the emulator: lanes not yet exited.
    unsigned active = __activemask();
    out[t * 4 + 0] = __ballot_sync(0xffffffff, p);
    out[t * 4 + 1] = __all_sync(0xffffffff, p);
    out[t * 4 + 2] = __any_sync(0xffffffff, p);
    __syncwarp();
    out[t * 4 + 3] = active;
}
// Warp-level sum of doubles and of __half2 pairs: non-int shuffle payloads.
extern "C" __global__ void warp_sum_double(const double* in, double* out) {
    double v = in[blockIdx.x * blockDim.x + threadIdx.x];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    out[blockIdx.x * blockDim.x + threadIdx.x] = v;
}
// Block reduction: warp shuffles then shared memory across warps.
extern "C" __global__ void block_sum_shfl(const float* in, float* out) {
    __shared__ float partial[32];
    float v = in[blockIdx.x * blockDim.x + threadIdx.x];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffff, v, o);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0) partial[w] = v;
    __syncthreads();
    if (w == 0) {
        v = lane < (int)(blockDim.x >> 5) ? partial[lane] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffff, v, o);
        if (lane == 0) out[blockIdx.x] = v;
    }
}
// The warp exchange (common.cuh's stand-ins use it) with `bytes` posted: 1..32 are legal.
extern "C" __global__ void share_bytes(const int* bytes, int* out) {
    const unsigned char buf[40] = {(unsigned char)threadIdx.x};
    const unsigned char* all = sharpinf_emu_warp_share(buf, *bytes);
    out[threadIdx.x] = all[32 * ((threadIdx.x + 1) & 31)];  // the next lane's first byte
}
