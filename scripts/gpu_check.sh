#!/usr/bin/env bash
# Runs on the GPU machine (device tool), from the repository root, with .device/bundle.tar.zst
# carried (scripts/gpu_bundle.sh makes it). One prepared pass, everything logged to $OUT:
#   1. the CUDA test suite (every kernel against the CPU backend, the device-resident decoder,
#      --device cuda end to end);
#   2. decode of synthetic:llama-3.1-8b (BF16) on --device cuda at a short and a long prompt,
#      tokens/s next to the HBM floor (weights + KV bytes per token over the copy bandwidth).
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/hgb
zstd -dc .device/bundle.tar.zst | tar -C /tmp/hgb -xf -
cublas=$(dirname "$(find / -name 'libcublas.so.1[0-9]*' -not -path '*/proc/*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=/tmp/hgb/lib:${cublas}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
log=$OUT/gpu_check.log
{
  date -u; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  echo "== CUDA tests"
  /tmp/hgb/bin/hg_tests --gtest_filter='Cuda*:DeviceContract*' 2>&1
  echo "== generate, synthetic:llama-3.1-8b bf16, --device cuda"
  /tmp/hgb/bin/hgbench generate --model "synthetic:llama-3.1-8b?dtype=bf16" --device cuda \
    --prompt-tokens 1024 -n 32 --ignore-eos --quiet 2>&1
  echo "== decode against the HBM floor (F32 KV in GPU memory)"
  /tmp/hgb/bin/hgbench bench --model "synthetic:llama-3.1-8b?dtype=bf16" --backend cuda --kv f32 \
    --context 128,8192,32768 --threads 1 --steps 8 --prefill 512 2>&1
} 2>&1 | tee "$log"
