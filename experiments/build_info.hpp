#pragma once
/// Facts about this build and machine, for `kdalab info` and the root attributes of result files.
#include <string>
#include <vector>

namespace kdalab::build_info {
extern const char* const version;     ///< project version, e.g. "0.1.0"
extern const char* const git_sha;     ///< commit the binary was built from (+"-dirty"), or "unknown"
extern const char* const compiler;    ///< compiler id and version
extern const char* const build_type;  ///< CMAKE_BUILD_TYPE
extern const bool cuda_built;         ///< whether kernels/ was compiled in
/// One line per visible GPU ("NVIDIA H200, driver 580.x, 132 SMs, 139.8 GiB"); empty when
/// kdalab was built without CUDA or no GPU/driver is present (cudaGetDeviceCount failing, e.g.
/// error 35, counts as zero GPUs).
std::vector<std::string> gpu_devices();
/// Why there are no GPU rows, when gpu_devices() is empty ("" otherwise).
std::string gpu_note();
}  // namespace kdalab::build_info
