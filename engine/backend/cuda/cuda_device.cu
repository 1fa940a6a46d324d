// CUDA device discovery for the backend registry. Compiled whenever nvcc is found (CI included);
// the kernels of the CUDA backend build on this file (issue 3).
#include <cuda_runtime.h>

namespace hg {

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

}  // namespace hg
