#!/usr/bin/env bash
# Builds hgbench and the test binary for a GPU machine and packs them, with the shared libraries
# they link that such a machine lacks (oneDNN, yaml-cpp, fmt, SentencePiece, libnuma, PCRE2, the
# GCC runtime, cudart), into .device/bundle.tar.gz, with the accuracy part's data in .device/shared (≤ 64 MiB, the device tool's carry limit; gzip: the GPU machine has no zstd).
# The CUDA driver and cuBLAS are the GPU machine's own. The default flags (x86-64-v3, CPU kernels
# chosen at run time) run on the GPU machine's CPU whatever it is. Then, with the device tool:
#   run(command="bash scripts/gpu_check.sh", carry=[".device"], timeout_s=500)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${HG_GPU_BUILD_DIR:-build-gpu}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DHG_CUDA=ON -DHG_NATIVE=OFF -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
cmake --build "$build" -j"$(nproc)" --target hgbench hg_tests
rm -rf .device/stage && mkdir -p .device/stage/bin .device/stage/lib
cp "$build/hgbench" .device/stage/bin/hgbench
cp "$build/tests/hg_tests" .device/stage/bin/
# Every resolved library except glibc's own, the CUDA driver and cuBLAS (large; on the machine).
for b in .device/stage/bin/*; do ldd "$b"; done | awk '/=> \//{print $3}' | sort -u |
  grep -Ev '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libcuda|libcublas[^/]*)\.so' |
  while read -r lib; do cp -L "$lib" .device/stage/lib/; done
tar -C .device/stage -czf .device/bundle.tar.gz .
rm -rf .device/stage
# The accuracy part's model and data (../shared does not travel to the GPU machine).
if [ -d ../shared/datasets ]; then
  rm -rf .device/shared && mkdir -p .device/shared/models
  cp -r ../shared/datasets .device/shared/ && cp -r ../shared/models/stories260K .device/shared/models/
fi
size=$(stat -c %s .device/bundle.tar.gz)
echo "wrote .device/bundle.tar.gz ($((size / 1048576)) MiB)"
[ "$size" -lt $((60 * 1048576)) ] || { echo "bundle too large for the device tool's 64 MiB carry" >&2; exit 1; }
