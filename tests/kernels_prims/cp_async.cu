// cp_async.cu (test-only) -- global -> shared -> global through cp_async_16.
//   cp_async_copy(src, dst, nchunks): src, dst unsigned[4 * nchunks] (16-byte chunks);
//   each block stages up to 256 chunks in shared memory, then writes them back reversed
//   within the block's tile (so a missing wait or sync shows up as wrong data).
// Launch: grid = ceil(nchunks / 256), block = 128 (any multiple of 32).
#include "common.cuh"

extern "C" __global__ void cp_async_copy(const unsigned* src, unsigned* dst, int nchunks) {
    __shared__ __align__(16) unsigned tile[256 * 4];
    const int base = blockIdx.x * 256;
    const int count = nchunks - base < 256 ? nchunks - base : 256;
    for (int c = threadIdx.x; c < count; c += blockDim.x)
        cp_async_16(tile + 4 * c, src + 4 * (long long)(base + c));
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();
    for (int c = threadIdx.x; c < count; c += blockDim.x)
        for (int w = 0; w < 4; ++w) dst[4 * (long long)(base + c) + w] = tile[4 * (count - 1 - c) + w];
}
