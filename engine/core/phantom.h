// Phantom memory for dry runs: address ranges of any size whose every 64 MiB window maps the same
// shared physical pages (one memfd). Code that reads and writes such a buffer runs as it would,
// but a 50 GB KV cache or a 14B model's weights cost 64 MiB of RAM; the values are meaningless.
// Dry execution (experiments' `execute: dry`) places weights and every tier allocation here.
#pragma once
#include <cstddef>

namespace hg {

// A phantom range of `bytes` (rounded up to the window), or nullptr when mapping fails.
void* phantom_alloc(size_t bytes);
// Releases a range from phantom_alloc (the same `bytes`).
void phantom_free(void* p, size_t bytes);
// Physical bytes behind all phantom ranges (the shared window).
size_t phantom_window_bytes();

}  // namespace hg
