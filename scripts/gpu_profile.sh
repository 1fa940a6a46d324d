#!/usr/bin/env bash
# Runs on the GPU machine (device tool), like gpu_check.sh, with .device/bundle.tar.gz carried:
# where the decode step's GPU time goes. Nsight Compute times every kernel of a short
# `bench --backend cuda` (one context, one timed step, a one-token prefill) with one metric
# (gpu__time_duration, no replay), and prints the per-kernel summary: launches, and the average and
# total duration of each kernel. Compare the total per step with the measured step time: the
# difference is time the GPU spent waiting for launches.
set -uo pipefail
. "$(dirname "$0")/gpu_env.sh"
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
context=${HG_PROFILE_CONTEXT:-8192}
{
  echo "ncu: ${ncu:-not found}"
  $hgbench bench --model "synthetic:llama-3.1-8b?dtype=bf16" --backend cuda --kv f32 --context "$context" \
    --threads 1 --steps 8 --prefill 1 2>&1
  timeout 400 "$ncu" --clock-control none --metrics gpu__time_duration.sum --csv --print-summary per-kernel \
    --log-file "$OUT/ncu_summary.csv" $hgbench bench --model "synthetic:llama-3.1-8b?dtype=bf16" \
    --backend cuda --kv f32 --context "$context" --threads 1 --steps 1 --prefill 1 2>&1 | tail -5
  echo "ncu rc ${PIPESTATUS[0]}; summary lines: $(wc -l < "$OUT/ncu_summary.csv")"
  head -c 6000 "$OUT/ncu_summary.csv"
} 2>&1 | tee "$OUT/gpu_profile.log"
