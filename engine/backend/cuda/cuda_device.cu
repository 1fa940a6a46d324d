// CUDA device discovery for the backend registry. Compiled whenever nvcc is found (CI included);
// the CUDA backend's kernels (cuda_kernels.cu) are built beside it.
#include <cuda_runtime.h>

namespace hg {

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

}  // namespace hg
