#!/usr/bin/env bash
# Runs on the GPU machine (device tool), from the repository root, with .device/bundle.tar.gz
# carried (scripts/gpu_bundle.sh makes it): bash scripts/gpu_check.sh. One prepared pass,
# everything logged to $OUT:
#   1. the CUDA test suite (every kernel against the CPU backend, the device-resident decoder,
#      the strategies on --device cuda);
#   2. `hgbench calibrate`: the machine's host rates and the GPU's (device copy, pinned link,
#      BF16 GEMM), written as a platform profile;
#   3. decode of synthetic:llama-3.1-8b (BF16 weights, F32 KV in GPU memory) at 128, 8K and 32K
#      tokens of context against the HBM floor (weights + KV bytes per token over the copy rate);
#   4. all eight strategies (bench --strategy) at 8K and 32K: decode tok/s and bytes per link, and
#      HybridGen end to end (generate) with a prompt longer than its GPU ring.
# Each part has its own time limit so that one hang does not cost the others. HG_GPU_PARTS picks
# parts (default: tests,calibrate,full,strategies,ablation,generate).
set -uo pipefail
. "$(dirname "$0")/gpu_env.sh"
log=$OUT/gpu_check.log
model="synthetic:llama-3.1-8b?dtype=bf16"
parts=",${HG_GPU_PARTS:-tests,calibrate,full,strategies,ablation,generate},"
want() { [[ $parts == *",$1,"* ]]; }
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,pcie.link.gen.current,pcie.link.width.current \
    --format=csv
  echo "cublas: ${cublas:-not found}; nproc $(nproc); $(grep -m1 'model name' /proc/cpuinfo); running $hgbench"
  ldd $hgbench | grep -E 'not found|cublas|cudart'
  if want tests; then
    echo "== CUDA tests"
    timeout 150 $bin/hg_tests --gtest_filter='Cuda*:DeviceContract*:GpuStrategies*' 2>&1
  fi
  if want calibrate; then
    echo "== calibrate"
    timeout 90 $hgbench calibrate --out "$OUT/h200.yaml" --seconds 0.3 2>&1
  fi
  if want full; then
    echo "== decode against the HBM floor (F32 KV in GPU memory)"
    timeout 200 $hgbench bench --model "$model" --backend cuda --kv f32 --context 128,8192,32768 --threads 1 \
      --steps 8 --prefill 512 2>&1
  fi
  if want strategies; then
    echo "== all eight strategies on the GPU: decode tok/s and bytes per link"
    timeout 420 $hgbench bench --model "$model" \
      --strategy full,flexgen,moe_lightning,h2o,keyformer,streamingllm,infinigen,hybridgen --device cuda \
      --context 8192,32768 --steps 4 2>&1
    echo "== hybridgen, its speculative query projected on the GPU (query_on=accelerator)"
    timeout 200 $hgbench bench --model "$model" --strategy hybridgen --device cuda --context 8192,32768 --steps 4 \
      --set hybridgen.query_on=accelerator 2>&1
  fi
  if want ablation; then
    echo "== hybridgen with the scheduler fixed: post selection, K = 1024"
    timeout 120 $hgbench bench --model "$model" --strategy hybridgen --device cuda --context 32768 --steps 4 \
      --set hybridgen.mode=post --set hybridgen.k=fixed --set hybridgen.k_fixed=1024 2>&1
  fi
  if want generate; then
    echo "== generate, hybridgen on --device cuda, 3000-token prompt (ring of 1024)"
    timeout 90 $hgbench generate --model "$model" --device cuda --strategy hybridgen --prompt-tokens 3000 -n 16 \
      --ignore-eos --quiet 2>&1
    echo "== generate, --device cuda"
    timeout 60 $hgbench generate --model "$model" --device cuda --prompt-tokens 512 -n 16 --ignore-eos 2>&1
  fi
} 2>&1 | tee "$log"
