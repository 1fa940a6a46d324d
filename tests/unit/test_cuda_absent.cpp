// Built instead of test_cuda_kernels.cpp when this build has no CUDA (no nvcc or HG_CUDA=OFF).
#include <gtest/gtest.h>

TEST(CudaKernels, NotCompiled) { GTEST_SKIP() << "this build was not compiled with CUDA support (HG_CUDA=OFF or no nvcc)"; }
