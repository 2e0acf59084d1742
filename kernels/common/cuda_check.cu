// kernels/common/cuda_check.hpp: a CUDA status -> kdalab::Error.
#include <string>

#include "kernels/common/cuda_check.hpp"

namespace kdalab::kernels {

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(std::string("CUDA error in ") + what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

}  // namespace kdalab::kernels
