// tls_live.cu -- floats held in vector registers across the first access to a static
// __shared__ array. The emulator makes static __shared__ thread_local in a dlopen'ed
// module; with TLS descriptors (-mtls-dialect=gnu2) g++ assumes that access preserves
// every vector register, which glibc < 2.40 breaks on the slow path (first access in a
// thread: __tls_get_addr -> malloc + memset). The array is too big for glibc's spare
// static TLS, so it is always dynamic TLS and the first access takes that slow path.
extern "C" __global__ void live_across_first_shared(const float* in, float* out, int store) {
    __shared__ float big[4096];
    const int t = threadIdx.x;
    float a[12];
    for (int i = 0; i < 12; ++i) a[i] = in[i] * (float)(t + 1);
    if (store) big[t] = a[0] + a[1];  // the first TLS access of the module
    float s = 0.0f;
    for (int i = 0; i < 12; ++i) s += a[i] * (float)(i + 1);
    out[t] = s + (store ? big[t] : 0.0f);
}
