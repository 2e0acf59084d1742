// GPU discovery for `kdalab info` and the device attribute. Never crashes on a CPU machine.
#include <string>
#include <vector>

#include "experiments/build_info.hpp"

#ifdef KDALAB_HAVE_CUDA
#include <cuda_runtime.h>
#include <fmt/format.h>
#endif

namespace kdalab::build_info {

#ifdef KDALAB_HAVE_CUDA
const bool cuda_built = true;
namespace {
int count_gpus(cudaError_t* err) {
  int n = 0;
  *err = cudaGetDeviceCount(&n);
  return *err == cudaSuccess ? n : 0;
}
}  // namespace
std::vector<std::string> gpu_devices() {
  cudaError_t err;
  const int n = count_gpus(&err);
  std::vector<std::string> out;
  int driver = 0;
  cudaDriverGetVersion(&driver);
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    out.push_back(fmt::format("{} (sm_{}{}, {} SMs, {:.1f} GiB, driver API {}.{})", p.name, p.major, p.minor,
                              p.multiProcessorCount, p.totalGlobalMem / 1073741824.0, driver / 1000,
                              (driver % 1000) / 10));
  }
  return out;
}
std::string gpu_note() {
  cudaError_t err;
  const int n = count_gpus(&err);
  if (n > 0) return "";
  if (err != cudaSuccess)
    return std::string("no GPU: cudaGetDeviceCount returned error ") + std::to_string(static_cast<int>(err)) + " (" +
           cudaGetErrorString(err) + "); GPU rows are skipped";
  return "no GPU visible; GPU rows are skipped";
}
#else
const bool cuda_built = false;
std::vector<std::string> gpu_devices() { return {}; }
std::string gpu_note() { return "CUDA kernels not built (configure with --preset cuda); GPU rows are skipped"; }
#endif

}  // namespace kdalab::build_info
