#pragma once
/// Host-side checks shared by every kernel of kernels/: cuda_check (a CUDA status -> kdalab::Error) and the
/// pointer / stride checks of the argument structs. Every check throws kdalab::Error naming the argument, its value and
/// what is accepted.
#include <cstddef>
#include <cstdint>
#include <string>

#include <cuda_runtime_api.h>

#include "reference/error.hpp"

namespace kdalab::kernels {

/// Throws kdalab::Error with the CUDA message when e != cudaSuccess; `what` names the call.
void cuda_check(cudaError_t e, const char* what);

namespace detail {

inline void check_ptr(const void* p, std::size_t align, const char* name, bool required = true) {
  if (!p) {
    if (required) throw Error(std::string("KDA kernel: pointer '") + name + "' is null; a device pointer is required");
    return;
  }
  if (reinterpret_cast<std::uintptr_t>(p) % align != 0)
    throw Error(std::string("KDA kernel: pointer '") + name + "' is not " + std::to_string(align) +
                "-byte aligned (address % " + std::to_string(align) + " = " +
                std::to_string(reinterpret_cast<std::uintptr_t>(p) % align) + "); accepted: " + std::to_string(align) +
                "-byte aligned device pointers");
}
inline void check_stride(std::int64_t s, std::int64_t mult, const char* name) {
  if (s <= 0 || s % mult != 0)
    throw Error(std::string("KDA kernel: stride '") + name + "' = " + std::to_string(s) +
                "; accepted: a positive multiple of " + std::to_string(mult) + " elements (16-byte rows)");
}

}  // namespace detail
}  // namespace kdalab::kernels
