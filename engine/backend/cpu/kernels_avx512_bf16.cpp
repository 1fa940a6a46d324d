// The CPU kernels built for AVX-512 with AVX512_BF16.
#define HG_KERNEL_NS avx512_bf16
#define HG_KERNEL_AVX512 1
#define HG_KERNEL_BF16 1
// This level takes most of its kernels from the AVX-512 table (kernel_table()): the header's other
// functions go unused here.
#pragma GCC diagnostic ignored "-Wunused-function"
#include "engine/backend/cpu/kernels_impl.h"
