# Sourced by gpu_check.sh and gpu_profile.sh on the GPU machine: unpacks .device/bundle.tar.gz
# into /tmp/hgb, finds the machine's own cuBLAS, and sets OUT, LD_LIBRARY_PATH, bin (the bundle's
# binaries) and hgbench (its CPU kernels pick the host's instruction set at run time).
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
hgbench=$bin/hgbench
