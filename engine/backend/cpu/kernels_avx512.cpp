// The CPU kernels built for AVX-512 F/BW/DQ/VL.
#define HG_KERNEL_NS avx512
#define HG_KERNEL_AVX512 1
#define HG_KERNEL_BF16 0
#include "engine/backend/cpu/kernels_impl.h"
