#!/usr/bin/env bash
# Runs every KV strategy on synthetic:llama-3.2-1b?layers=4 with a 4096-token prompt on the
# host-emulated accelerator, 16 generated tokens, and prints each one's timing line and last
# per-step record (bytes moved per link, K, mode, …). Used for docs/strategies.md.
set -euo pipefail
BIN="${HG_BUILD_DIR:-$(dirname "$0")/../build}/hgbench"
MODEL="synthetic:llama-3.2-1b?layers=4&dtype=bf16"
COMMON=(--model "$MODEL" --prompt-tokens 4096 -n 16 --device emulated --quiet --step-stats)
run() {
  local name=$1
  shift
  echo "== $name $*"
  "$BIN" generate "${COMMON[@]}" --strategy "$name" "$@" 2>&1 | grep -E "^prefill|^step 14:" || true
}
run full
run flexgen
run flexgen --set flexgen.overlap=false
run moe_lightning
run h2o
run keyformer
run streamingllm
run infinigen
run hybridgen --set hybridgen.gpu_kv_tokens=1024
run hybridgen --set hybridgen.gpu_kv_tokens=1024 --set hybridgen.placement=interleave
