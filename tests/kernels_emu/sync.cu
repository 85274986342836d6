// Barrier and shared-memory kernels for tests/test_emu_semantics.py.

// Tree reduction over 256 threads: wrong without its barriers in any order.
extern "C" __global__ void block_sum(const float* x, float* out) {
    __shared__ float s[256];
    int t = threadIdx.x;
    s[t] = x[blockIdx.x * 256 + t];
    __syncthreads();
    for (int h = 128; h > 0; h >>= 1) {
        if (t < h) s[t] += s[t + h];
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = s[0];
}

// Planted bug: reads a neighbour's shared slot with no barrier in between.
// Running threads in forward order hides it; reverse order exposes it.
// (salt differs per launch: static shared memory keeps old contents, as on a GPU.)
extern "C" __global__ void missing_barrier(int* out, int salt) {
    __shared__ int s[128];
    int t = threadIdx.x;
    s[t] = t * 3 + salt;
    out[t] = t > 0 ? s[t - 1] : -1;  // needs __syncthreads() before this line
}

// Static shared memory: one copy per block, visible to all its threads.
extern "C" __global__ void static_shared(int* out) {
    __shared__ int v;
    if (threadIdx.x == 0) v = blockIdx.x * 10 + 7;
    __syncthreads();
    out[blockIdx.x * blockDim.x + threadIdx.x] = v;
}

// Dynamic shared memory: read before any write must see the NaN poison.
extern "C" __global__ void dyn_shared_poison(float* out) {
    extern __shared__ float dyn[];
    int t = threadIdx.x;
    out[blockIdx.x * blockDim.x + t] = dyn[t];
    __syncthreads();
    dyn[t] = 1.0f;
}

// Dynamic shared memory used properly, typed through a template parameter.
template <typename T>
__global__ void dyn_reverse(const T* in, T* out) {
    extern __shared__ __align__(16) unsigned char raw[];
    T* s = reinterpret_cast<T*>(raw);
    int t = threadIdx.x, n = blockDim.x;
    s[t] = in[blockIdx.x * n + t];
    __syncthreads();
    out[blockIdx.x * n + t] = s[n - 1 - t];
}

extern "C" __global__ void sync_count(const int* pred, int* out) {
    int t = threadIdx.x;
    int c = __syncthreads_count(pred[t]);
    int a = __syncthreads_and(pred[t]);
    int o = __syncthreads_or(pred[t]);
    out[t * 3 + 0] = c;
    out[t * 3 + 1] = a;
    out[t * 3 + 2] = o;
}

// 2-D block: threadIdx.y participates in the barrier and the indexing.
extern "C" __global__ void transpose_tile(const float* in, float* out) {
    __shared__ float tile[16][17];
    int x = threadIdx.x, y = threadIdx.y;
    tile[y][x] = in[y * 16 + x];
    __syncthreads();
    out[y * 16 + x] = tile[x][y];
}

// Dynamic shared memory declared at namespace scope (rewritten to a macro).
extern __shared__ float ns_dyn[];
extern "C" __global__ void ns_dyn_rotate(float* x) {
    int t = threadIdx.x, n = blockDim.x;
    ns_dyn[t] = x[t];
    __syncthreads();
    x[t] = ns_dyn[(t + 1) % n];
    if (t == 0) __trap();  // MARK:after_ns_dyn
}
