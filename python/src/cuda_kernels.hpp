#pragma once
/// The CUDA parts of the Python module (built with KDALAB_CUDA only).
#include <nanobind/nanobind.h>

namespace kdalab::py {

/// Adds the cuda_* entry points (kdalab's kernels on CUDA arrays through DLPack; python/src/cuda_kernels.cpp).
void bind_cuda(nanobind::module_& m);

/// Adds the _host_* functions: the same kernels run the way the C++ GPU tests run them (tests/gpu/: inputs
/// uploaded from host arrays with cudaMemcpy, outputs downloaded), for python/tests/test_cuda_kernels.py
/// (python/src/cuda_host_path.cpp).
void bind_cuda_host_path(nanobind::module_& m);

}  // namespace kdalab::py
