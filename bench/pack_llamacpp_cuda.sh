#!/usr/bin/env bash
# Build llama.cpp's CUDA benches on this GPU-less machine and pack them for a device call, so a
# short lease measures instead of compiling ggml-cuda (~45 min on 2 cores here; once per pin).
#
#   bench/pack_llamacpp_cuda.sh [WORKDIR]   -> .peers/llama-cuda-sm<ARCH>.tar.xz (ARCH: $CUDA_ARCH, default 90)
#
# The source is ../shared/peers/ (llama.cpp at its pinned commit). What this machine lacks, and how:
#   cuBLAS      the nvidia-cublas wheel (CUDA 13) from PyPI, unpacked: headers and libcublas*.so.13 to
#               link against; at run time the device's own (its PyTorch's wheel) is loaded
#   libcuda     ggml-cuda calls the driver API (the VMM pool): a stub libcuda.so.1 holding those
#               symbols satisfies the linker; the device's driver provides the real one
# The tarball holds bin/: llama-bench, llama-batched-bench, their shared libraries, libcudart and
# libgomp (the device image's may differ). bench/prepare_gpu_slot.sh copies it into .slot-carry/; bench/gpu_slot.py unpacks it there and sets LD_LIBRARY_PATH.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mkdir -p "${1:-/tmp/sharpinf-llamacpp-pack}" && cd "${1:-/tmp/sharpinf-llamacpp-pack}" && pwd)
peers=${PEERS_DIR:-$repo/../shared/peers}
arch=${CUDA_ARCH:-90}
cd "$work"

[ -d llama.cpp ] || tar -xJf "$peers"/llama.cpp-*-src.tar.xz
if ! ls cub/nvidia/cu13/lib/libcublas.so.13 >/dev/null 2>&1; then
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d whl "nvidia-cublas>=13,<14"
  mkdir -p cub && (cd cub && unzip -q -o ../whl/nvidia_cublas-*.whl)
fi
cub=$work/cub/nvidia/cu13
mkdir -p shim/lib shim/include stub
for f in "$cub"/lib/libcublas*.so.13; do b=$(basename "$f"); ln -sf "$f" "shim/lib/${b%%.so.*}.so"; ln -sf "$f" "shim/lib/$b"; done
ln -sf "$cub"/include/* shim/include/

# the driver-API symbols ggml-cuda links (its VMM pool); signatures do not matter to the linker
syms=$(grep -rhoE '\bcu[A-Z][A-Za-z0-9_]+\(' llama.cpp/ggml/src/ggml-cuda/*.cu llama.cpp/ggml/src/ggml-cuda/*.cuh \
       | tr -d '(' | grep -vE '^cu(BLAS|blas|da|rand|fft|sparse|dnn)' | sort -u)
{ echo "/* link-time stand-in for the driver's libcuda.so.1 (pack_llamacpp_cuda.sh) */"
  for s in $syms; do echo "int $s(void) { return 0; }"; done; } > stub/cuda_stub.c
gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o stub/libcuda.so stub/cuda_stub.c
ln -sf libcuda.so stub/libcuda.so.1

cmake -S llama.cpp -B llama.cpp/build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DGGML_NATIVE=OFF -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" \
  -DCMAKE_LIBRARY_PATH="$work/shim/lib" -DCMAKE_INCLUDE_PATH="$work/shim/include" \
  -DCMAKE_CXX_FLAGS="-I$work/shim/include" -DCMAKE_CUDA_FLAGS="-I$work/shim/include" \
  -DCUDA_cuda_driver_LIBRARY="$work/stub/libcuda.so" >/dev/null
# the executables' link resolves libggml-cuda's DT_NEEDED libcuda.so.1 and libcublas through this path
LD_LIBRARY_PATH="$work/stub:$work/shim/lib" nice cmake --build llama.cpp/build-cuda -j"$(nproc)" \
  --target llama-bench llama-batched-bench >build.log 2>&1 || { tail -20 build.log; exit 1; }

bin=llama.cpp/build-cuda/bin
rm -rf pack && mkdir -p pack/bin
cp -L "$bin"/llama-bench "$bin"/llama-batched-bench "$bin"/libllama-bench-impl.so "$bin"/libllama-batched-bench-impl.so pack/bin/
for l in libggml-base.so.0 libggml-cpu.so.0 libggml-cuda.so.0 libggml.so.0 libllama-common.so.0 libllama.so.0; do
  cp -L "$bin/$l" pack/bin/
done
cudart=$(echo 'int main(){}' | nvcc -x cu - -o /tmp/pack_probe --cudart shared -Xlinker -t 2>/dev/null \
         | grep -o '/[^ ()]*libcudart.so[^ ()]*' | head -1)  # the toolkit's own, wherever nvcc keeps it
cp -L "${cudart:?nvcc linked no libcudart.so}" pack/bin/libcudart.so.13
cp -L "$(gcc -print-file-name=libgomp.so.1)" pack/bin/
strip --strip-unneeded pack/bin/*
mkdir -p "$repo/.peers"
out=$repo/.peers/llama-cuda-sm$arch.tar.xz
tar -cJf "$out" -C pack bin
echo "$out"
