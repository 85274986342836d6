// Shared-memory hazards and uninitialised reads for tests/test_emu_racecheck.py. Each planted bug
// is a line marked MARK:<name> (the tests find the line the report must name).

// Planted: warp 1 reads what warp 0 wrote in the same barrier interval (no __syncthreads
// between). Forward order: a read-after-write; reverse order: a write-after-read.
extern "C" __global__ void raw_across_warps(float* out) {
    __shared__ float s[64];
    const int t = threadIdx.x;
    s[t] = 0.0f;
    __syncthreads();
    if (t < 32) s[t] = (float)t;  // MARK:raw_write
    float v = t >= 32 ? s[t - 32] : 0.0f;  // MARK:raw_read
    out[t] = v;
}

// Tree reduction; `barrier` 0 plants the classic bug: the barrier inside the loop left out.
extern "C" __global__ void reduce(const float* x, float* out, int barrier) {
    __shared__ float red[128];
    const int t = threadIdx.x;
    red[t] = x[t];
    __syncthreads();
    for (int h = 64; h > 0; h >>= 1) {
        if (t < h) red[t] += red[t + h];  // MARK:reduce_add
        if (barrier) __syncthreads();
    }
    if (t == 0) out[0] = red[0];
}

// Lanes of one warp exchange through shared memory. sync 1: __syncwarp orders it (no hazard);
// sync 0: a shuffle between write and read, which exchanges registers and orders no memory.
extern "C" __global__ void warp_exchange(float* out, int sync) {
    __shared__ float w[32];
    const int lane = threadIdx.x;
    w[lane] = (float)lane;  // MARK:warp_write
    if (sync) __syncwarp();
    else (void)__shfl_sync(0xffffffffu, lane, 0);
    out[lane] = w[lane ^ 1];  // MARK:warp_read
}

// Two threads of one warp write one word in one interval.
extern "C" __global__ void waw_same_word(int* out) {
    __shared__ int flag;
    flag = threadIdx.x;  // MARK:waw_write
    __syncthreads();
    out[threadIdx.x] = flag;
}

// Planted: half the threads read a slot no thread of this block wrote.
extern "C" __global__ void uninit_static(float* out) {
    __shared__ float half_s[64];
    const int t = threadIdx.x;
    if (t < 32) half_s[t] = 1.0f;
    __syncthreads();
    out[t] = half_s[t];  // MARK:uninit_read
}

// Planted: reads the slot past the written ones of a two-slot-per-thread dynamic buffer.
extern "C" __global__ void uninit_dynamic(float* out) {
    extern __shared__ float dyn_s[];
    const int t = threadIdx.x;
    dyn_s[t] = 2.0f;
    __syncthreads();
    out[t] = dyn_s[t + 1];  // MARK:uninit_dyn
}

// Correct code the checks must pass: a reduction with its barriers, shared atomics counted
// across warps, cp.async-style fixed-size copies into shared memory, a 2-D array.
extern "C" __global__ void clean(const float* x, float* out, int* count) {
    __shared__ float tile[4][33];
    __shared__ int hits;
    __shared__ __align__(16) float staged[64];
    const int t = threadIdx.x;
    if (t == 0) hits = 0;
    if (t < 16) __builtin_memcpy(&staged[4 * t], &x[4 * t], 16);
    __syncthreads();
    atomicAdd(&hits, 1);
    tile[t / 32][t % 32] = staged[t % 64];
    __syncthreads();
    float v = tile[(t / 32 + 1) % 4][t % 32];
    __syncthreads();
    if (t == 0) *count = hits;
    out[t] = v;
}

// Static shared memory is poisoned for every block: block 1 must not see block 0's value.
extern "C" __global__ void static_per_block(int* out) {
    __shared__ int carried;
    if (blockIdx.x == 0 && threadIdx.x == 0) carried = 42;
    __syncthreads();
    if (threadIdx.x == 0) out[blockIdx.x] = carried;
}

// A copy g++ does not instrument -- longer than 16 bytes (dp4a.cuh's 32-byte loads on the emulator,
// sometimes), or of a length known only at run time (always) -- into shared memory: the checks must
// see it, as a write (no false uninitialised read after it) and as an access (a race through it is
// caught). race = 1 drops the barrier between the copy and another warp's read. nbytes = 32.
extern "C" __global__ void copy32(const int* x, int* out, int race, int nbytes) {
    __shared__ __align__(16) int words[64];
    const int t = threadIdx.x;
    if (race) {  // initialised first: what is left to find is the race, not an uninitialised read
        words[t] = 0;
        __syncthreads();
    }
    if (t < 8) __builtin_memcpy(&words[8 * t], &x[8 * t], nbytes);  // MARK:copy32_write
    if (!race) __syncthreads();
    out[t] = words[63 - t];
}

// Three readers of one word, then a write by one of them after its warp's __syncwarp: lanes 0 and 1
// (ordered before the write by the __syncwarp) and thread 40 of the other warp (not: a hazard). The
// check keeps two readers a byte; which two must not decide whether it sees thread 40.
extern "C" __global__ void war_third_reader(float* out) {
    __shared__ float w[1];
    const int t = threadIdx.x;
    if (t == 0) w[0] = 1.0f;
    __syncthreads();
    float v = 0.0f;
    if (t < 2 || t == 40) v = w[0];  // MARK:third_read
    __syncwarp();
    if (t == 0) w[0] = 2.0f;  // MARK:third_write
    out[t] = v;
}

// A lane reads a word before and after its warp's __syncwarp; another lane writes it after the
// __syncwarp with nothing between: a hazard with the second read, which the check must keep.
extern "C" __global__ void war_reread(float* out) {
    __shared__ float r[1];
    const int t = threadIdx.x;
    if (t == 0) r[0] = 1.0f;
    __syncthreads();
    float v = 0.0f;
    if (t == 0) v = r[0];
    __syncwarp();
    if (t == 0) v += r[0];  // MARK:reread
    if (t == 1) r[0] = 2.0f;  // MARK:reread_write
    out[t] = v;
}
