// The CPU kernels built for plain C++ (the build's baseline flags).
#define HG_KERNEL_NS portable
#define HG_KERNEL_AVX512 0
#define HG_KERNEL_BF16 0
#include "engine/backend/cpu/kernels_impl.h"
