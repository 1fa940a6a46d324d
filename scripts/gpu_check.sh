#!/usr/bin/env bash
# Runs on the GPU machine (device tool), from the repository root, with .device/ carried
# (scripts/gpu_bundle.sh packs .device/bundle.tar.gz and copies the accuracy data beside it):
# bash scripts/gpu_check.sh. One prepared pass, everything logged to $OUT, bounded as a whole by
# HG_GPU_SECONDS (default 450) so that a hang in one part leaves time for the others:
#   tests       the CUDA test suite (every kernel against the CPU backend, the device-resident
#               decoder, the strategies on --device cuda);
#   calibrate   `hgbench calibrate`: host rates, the GPU's copy, link, GEMM, achieved kernel rates
#               and fixed costs, written as a platform profile ($OUT/h200.yaml);
#   clock       experiments/clock_check_gpu.yaml: all eight strategies for real at 8K and 32K, F16
#               KV, replayed on that profile (modeled ÷ measured per row; $OUT/clock/);
#               (HG_GPU_CLOCK_ARGS: extra `--set`s, e.g. fewer strategies or lengths);
#   full        decode of `full` with F32 KV in HBM at 128 / 8K / 32K against the HBM floor (`bench
#               --backend cuda` reads F32 KV; the clock rows give `full` with F16 KV);
#   accuracy    experiments/accuracy.yaml at limit=20 on the GPU (items/s per strategy).
# HG_GPU_PARTS picks parts (default: all, in that order).
set -uo pipefail
. "$(dirname "$0")/gpu_env.sh"
export CUDA_MODULE_LOADING=EAGER  # kernel images load at start-up, not inside the first timed step
log=$OUT/gpu_check.log
model="synthetic:llama-3.1-8b?dtype=bf16"
parts=",${HG_GPU_PARTS:-tests,calibrate,clock,full,accuracy},"
want() { [[ $parts == *",$1,"* ]]; }
deadline=$((SECONDS + ${HG_GPU_SECONDS:-450}))
# limit BUDGET: the part's own limit, cut to what is left before the deadline (at least 5 s).
limit() { local left=$((deadline - SECONDS)); ((left < 5)) && left=5; echo $(($1 < left ? $1 : left)); }
part() { echo "== $1 (at ${SECONDS}s, limit $2 s)"; }
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,pcie.link.gen.current,pcie.link.width.current \
    --format=csv
  echo "cublas: ${cublas:-not found}; nproc $(nproc); $(grep -m1 'model name' /proc/cpuinfo); running $hgbench"
  ldd $hgbench | grep -E 'not found|cublas|cudart'
  if want tests; then
    t=$(limit 150); part "CUDA tests" $t
    timeout $t $bin/hg_tests --gtest_filter='Cuda*:DeviceContract*:GpuStrategies*' 2>&1 | grep -Ev '^\[ +(RUN|OK) +\]'
    echo "tests rc ${PIPESTATUS[0]}"
  fi
  profile=$OUT/h200.yaml
  if want calibrate; then
    t=$(limit 60); part "calibrate" $t
    timeout $t $hgbench calibrate --out "$profile" 2>&1
    echo "calibrate rc $?"
    cat "$profile" 2>/dev/null
  fi
  if want clock; then
    t=$(limit 300); part "clock check: 8 strategies x {8K, 32K}, F16 KV, measured and replayed" $t
    clock=calibrate
    [ -s "$profile" ] && clock=$profile
    timeout $t $hgbench run experiments/clock_check_gpu.yaml --set clock=modeled:$clock ${HG_GPU_CLOCK_ARGS:-} \
      -o "$OUT/clock" 2>&1
    echo "clock rc $?"
    cat "$OUT/clock/table.txt" 2>/dev/null
  fi
  if want full; then
    t=$(limit 120); part "decode against the HBM floor (full, F32 KV in GPU memory)" $t
    timeout $t $hgbench bench --model "$model" --backend cuda --kv f32 --context ${HG_GPU_CONTEXTS:-128,8192,32768} --threads 1 \
      --steps 8 --prefill 512 2>&1
    echo "full rc $?"
  fi
  if want accuracy; then
    t=$(limit 120); part "accuracy.yaml, limit=20, on the GPU" $t
    data=.device/shared
    timeout $t $hgbench run experiments/accuracy.yaml --set limit=20 --set device=cuda \
      --set "models=[$data/models/stories260K/stories260K.gguf]" --set eval.data_dir=$data/datasets \
      -o /tmp/accuracy 2>&1 | tail -30
    echo "accuracy rc ${PIPESTATUS[0]}"
    cat /tmp/accuracy/table.txt 2>/dev/null
    cp /tmp/accuracy/summary.csv "$OUT/accuracy_summary.csv" 2>/dev/null
  fi
  echo "== done at ${SECONDS}s"
} 2>&1 | tee "$log"
