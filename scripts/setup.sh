#!/usr/bin/env bash
# Shared set-up for scripts/hgbench and scripts/test: install missing Debian packages (as root),
# then configure and build build/ (cmake's own dependency tracking makes a fresh build a no-op).
# Sourced, not run. Honours HG_BUILD_DIR (default build) and HG_CMAKE_ARGS.
set -euo pipefail
HG_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HG_BUILD_DIR="${HG_BUILD_DIR:-$HG_ROOT/build}"
HG_PACKAGES=(g++ cmake make pkg-config libdnnl-dev libyaml-cpp-dev libfmt-dev libsentencepiece-dev
  libnuma-dev libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev libeigen3-dev libpcre2-dev
  libcli11-dev libcsv-dev)

hg_install_deps() {
  local missing=()
  for p in "${HG_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "hgbench: missing Debian packages; run as root:" >&2
    echo "  apt-get install -y --no-install-recommends ${missing[*]}" >&2
    exit 2
  fi
  echo "hgbench: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2 || true
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

# hg_build [TARGET…]: configure once, then build the targets (default: all of them). Configure and
# build output go to BUILD/build.log and are shown only when a step fails.
hg_build() {
  local jobs log
  jobs="$(nproc)"
  mkdir -p "$HG_BUILD_DIR"
  log="$HG_BUILD_DIR/build.log"
  : >"$log"
  # Configure a fresh build directory, or an existing one again when HG_CMAKE_ARGS asks for settings.
  local configure=()
  if [ ! -f "$HG_BUILD_DIR/CMakeCache.txt" ]; then
    echo "hgbench: configuring $HG_BUILD_DIR (log: $log)" >&2
    # Unity batches: a fresh build compiles the heavy headers once per batch (CMakeLists.txt, HG_UNITY).
    configure=(-DCMAKE_BUILD_TYPE=Release -DHG_UNITY=ON)
  fi
  if [ ${#configure[@]} -gt 0 ] || [ -n "${HG_CMAKE_ARGS:-}" ]; then
    # shellcheck disable=SC2086
    cmake -S "$HG_ROOT" -B "$HG_BUILD_DIR" "${configure[@]}" ${HG_CMAKE_ARGS:-} >>"$log" 2>&1 ||
      { tail -n 40 "$log" >&2; echo "hgbench: configure failed (whole log: $log)" >&2; exit 1; }
  fi
  echo "hgbench: building ${*:-everything} (log: $log)" >&2
  local targets=()
  [ $# -gt 0 ] && targets=(--target "$@")
  cmake --build "$HG_BUILD_DIR" -j "$jobs" "${targets[@]}" >>"$log" 2>&1 ||
    { grep -E "error|Error" "$log" | head -n 30 >&2; tail -n 20 "$log" >&2; echo "hgbench: build failed (whole log: $log)" >&2; exit 1; }
}

# True when a CUDA device is visible (the CUDA sources are then worth compiling for a run).
hg_gpu_visible() {
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q "^GPU"
}
