# Sourced by gpu_check.sh and gpu_profile.sh on the GPU machine: unpacks .device/bundle.tar.gz
# into /tmp/hgb, finds the machine's own cuBLAS, and sets OUT, LD_LIBRARY_PATH, bin (the bundle's
# binaries) and hgbench (the AVX-512 build where the host has what it was compiled for, else the
# AVX2 one).
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/hgb
tar -C /tmp/hgb -xzf .device/bundle.tar.gz
# cuBLAS is the machine's own: the linker cache, a CUDA toolkit, or the Python wheels' copy.
cublas=$(ldconfig -p | awk '/libcublas\.so\.13 /{print $NF; exit}')
[ -n "$cublas" ] || cublas=$(ls /usr/local/cuda*/lib64/libcublas.so.13 /usr/local/cuda*/targets/*/lib/libcublas.so.13 \
  2>/dev/null | head -1)
[ -n "$cublas" ] || cublas=$(find / -xdev -name 'libcublas.so.13' 2>/dev/null | head -1)
export LD_LIBRARY_PATH=/tmp/hgb/lib:${cublas:+$(dirname "$cublas"):}/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
bin=/tmp/hgb/bin
flags=$(grep -m1 '^flags' /proc/cpuinfo)
hgbench=$bin/hgbench
for f in avx512f avx512bw avx512vl avx512dq avx512cd avx512_bf16; do
  [[ " $flags " == *" $f "* ]] || hgbench=$bin/hgbench-avx2
done
