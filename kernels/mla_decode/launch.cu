// mla_decode (kernels/mla.hpp): the pointer, stride and workspace checks, the kernel parameters and the launches of
// the split kernel (split.cu) and, unless the output is direct, the combine kernel (combine.cu).
// Design and measurements: docs/kernels/mla_decode.md.
#include <cmath>
#include <cstdint>
#include <string>

#include "kernels/mla.hpp"
#include "kernels/mla_decode/decode.cuh"

namespace kdalab::kernels {

namespace {
using namespace mla_decode_impl;

const char* const OP = "mla_decode";

void check_pointer(const void* ptr, std::size_t align, const char* name, bool required = true) {
  if (!ptr) {
    if (required) throw Error(std::string(OP) + ": pointer '" + name + "' is null; a device pointer is required");
    return;
  }
  const auto off = reinterpret_cast<std::uintptr_t>(ptr) % align;
  if (off != 0)
    throw Error(std::string(OP) + ": pointer '" + name + "' is not " + std::to_string(align) + "-byte aligned (address % " +
                std::to_string(align) + " = " + std::to_string(off) + "); accepted: " + std::to_string(align) +
                "-byte aligned device pointers");
}

}  // namespace

void mla_decode(const MlaDecodeArgs& a, cudaStream_t stream, const MlaDecodeOverrides* ov) {
  const MlaDecodePlan pl = mla_decode_plan(a, ov);
  const bool fast = pl.precision == MlaDecodePrecision::fast;
  check_pointer(a.c, 16, "c");
  check_pointer(a.q_hi, 4, "q_hi");
  if (fast) {
    if (a.q_lo)
      throw Error(std::string(OP) + ": pointer 'q_lo' is given with precision = fast (s_q = " + std::to_string(a.s_q) +
                  "), which reads the bf16 query q_hi alone; accepted: q_lo = null with fast (precision = accurate, "
                  "s_q = 1, for the hi + lo query)");
  } else {
    check_pointer(a.q_lo, 4, "q_lo");
  }
  check_pointer(a.out, 16, "out");
  check_pointer(a.lens, 4, "lens", false);
  check_pointer(a.workspace, 16, "workspace");
  if (!std::isfinite(a.scale) || !(a.scale > 0.0f))
    throw Error(std::string(OP) + ": scale = " + std::to_string(a.scale) + "; accepted: a finite scale > 0");
  const long long sc_t = a.sc_t ? a.sc_t : DC;
  if (sc_t < DC || sc_t % 8 != 0)
    throw Error(std::string(OP) + ": sc_t = " + std::to_string(sc_t) +
                "; accepted: a multiple of 8 elements >= d_c = 512 (512: latent only; 576: [c ; k_R] rows)");
  const long long sc_b = a.sc_b ? a.sc_b : static_cast<long long>(a.capacity) * sc_t;
  if (sc_b % 8 != 0 || (a.B > 1 && sc_b < static_cast<long long>(a.capacity) * sc_t))
    throw Error(std::string(OP) + ": sc_b = " + std::to_string(sc_b) + "; accepted: a multiple of 8 elements >= capacity * sc_t = " +
                std::to_string(static_cast<long long>(a.capacity) * sc_t));
  const long long sq_t = a.sq_t ? a.sq_t : static_cast<long long>(a.H) * DC;
  if (sq_t % 2 != 0 || sq_t < static_cast<long long>(a.H) * DC)
    throw Error(std::string(OP) + ": sq_t = " + std::to_string(sq_t) + "; accepted: an even number of elements >= H * d_c = " +
                std::to_string(a.H * DC));
  const long long q_rows = (a.s_q - 1) * sq_t + static_cast<long long>(a.H) * DC;  // one sequence's query elements
  const long long sq_b = a.sq_b ? a.sq_b : a.s_q * sq_t;
  if (sq_b % 2 != 0 || sq_b < q_rows)
    throw Error(std::string(OP) + ": sq_b = " + std::to_string(sq_b) + "; accepted: an even number of elements >= " +
                (a.s_q == 1 ? std::string("H * d_c = ") : std::string("(s_q - 1) * sq_t + H * d_c = ")) +
                std::to_string(q_rows));
  const std::size_t need = static_cast<std::size_t>(a.B) * pl.num_splits * a.s_q * a.H * (DC + 2) * 4;
  if (a.workspace_bytes < need)
    throw Error(std::string(OP) + ": workspace_bytes = " + std::to_string(a.workspace_bytes) + "; accepted: >= " +
                std::to_string(need) + " (mla_decode_workspace_bytes)");
  FastParams p{};  // the accurate kernels read its DecodeParams part
  p.B = a.B; p.max_len = a.max_len; p.split_len = pl.split_len; p.num_splits = pl.num_splits;
  p.lens = a.lens; p.c = a.c; p.sc_b = sc_b; p.sc_t = sc_t;
  p.q_hi = a.q_hi; p.q_lo = a.q_lo; p.sq_b = sq_b;
  p.scale_log2 = a.scale * 1.4426950408889634f;
  p.ws_acc = static_cast<float*>(a.workspace);
  p.ws_ml = p.ws_acc + static_cast<std::size_t>(a.B) * pl.num_splits * a.s_q * a.H * DC;
  p.out = a.out;
  p.q16 = (reinterpret_cast<std::uintptr_t>(a.q_hi) % 16 == 0 && reinterpret_cast<std::uintptr_t>(a.q_lo) % 16 == 0 &&
           sq_b % 8 == 0 && (a.s_q == 1 || sq_t % 8 == 0)) ? 1 : 0;  // (q_lo null with fast: 0 % 16 == 0)
  p.p_hi_only = ov && ov->p_hi_only ? 1 : 0;
  p.direct = pl.output == MlaDecodeOutput::direct ? 1 : 0;
  p.s_q = a.s_q;
  p.groups = pl.row_groups;
  p.sq_t = sq_t;
  launch_split(a.H, fast, dim3(pl.num_splits * pl.row_groups, a.B), stream, p);
  if (!p.direct) launch_combine(a.H, fast, a.B, pl.num_splits, stream, p);
}

}  // namespace kdalab::kernels
