// The plan of the absorbed MLA decode (kernels/mla.hpp): the shape checks, the slice count and length, the output
// path (direct or combine) and the workspace size. Host code only. Design and measurements:
// docs/kernels/mla_decode.md.
#include <algorithm>
#include <string>

#include "kernels/mla.hpp"
#include "kernels/mla_decode/decode.cuh"

namespace kdalab::kernels {

namespace {
using namespace mla_decode_impl;

const char* const OP = "mla_decode";
/// The fewest tokens of an automatic slice: one 64-token block (fewer, larger slices measured slower at short N:
/// N = 8192 on 128 slices of 64 instead of 32 of 256, 16.2 -> 12.3 us per graph step on an H200).
constexpr int MIN_SPLIT = BLK;
/// A slice's fixed cost in tokens of streaming (the q~ load, 64 KB, and the partial, 64 KB written + read by the
/// combine: ~128 tokens of 1 KB at the streaming rate). The direct output (one slice per sequence) skips the combine,
/// so this slightly overcharges that choice; it is a tuning constant (docs/kernels/mla_decode.md).
constexpr int FIXED_TOKENS = 128;

void check_shapes(const MlaDecodeArgs& a, const MlaDecodeOverrides* ov) {
  auto fail = [](const std::string& m) { throw Error(std::string(OP) + ": " + m); };
  if (a.d_c != DC) fail("d_c = " + std::to_string(a.d_c) + " is not supported; accepted: d_c = 512");
  if (a.d_rope != 0)
    fail("d_rope = " + std::to_string(a.d_rope) +
         ": the decoupled-RoPE score part is not implemented yet; accepted: d_rope = 0 (NoPE)");
  if (a.H != 16 && a.H != 32) fail("H = " + std::to_string(a.H) + " is not supported; accepted: H = 16 or 32");
  if (a.B < 1 || a.B > 65535) fail("B = " + std::to_string(a.B) + "; accepted: 1 <= B <= 65535");
  if (a.capacity < 1) fail("capacity = " + std::to_string(a.capacity) + "; accepted: >= 1 token");
  if (a.max_len < 1 || a.max_len > a.capacity)
    fail("max_len = " + std::to_string(a.max_len) + "; accepted: 1 <= max_len <= capacity = " +
         std::to_string(a.capacity) + " (N = 0 or a context past the cache capacity)");
  if (!ov) return;
  if (ov->num_splits < 0)
    fail("overrides num_splits = " + std::to_string(ov->num_splits) + "; accepted: >= 0 (0 = automatic)");
  const int o = static_cast<int>(ov->output);
  if (o < 0 || o > 2)
    fail("overrides output = " + std::to_string(o) + "; accepted: automatic (0), direct (1) or combine (2)");
}

/// SM count of the current device, queried once per device (so that a call inside CUDA-graph capture makes no
/// attribute query).
int sm_count() {
  static int counts[64] = {};
  int dev = 0;
  cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
  int sms = dev < 64 ? counts[dev] : 0;
  if (sms == 0) {
    cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
    if (dev < 64) counts[dev] = sms;
  }
  return sms;
}

/// The automatic slice count: the count of least modelled time, waves x (split_len + FIXED_TOKENS), with split_len
/// rounded up to whole 64-token blocks and the resulting slice count (one CTA per SM: the split kernel needs ~210 KB
/// of shared memory).
int auto_splits(const MlaDecodeArgs& a) {
  const int sms = sm_count();
  int splits = 1;
  long long best_cost = -1;
  const int smax = std::max(1, a.max_len / MIN_SPLIT);
  for (int s = 1; s <= std::min(smax, 4 * ((sms + a.B - 1) / a.B)); ++s) {
    const int len = ((a.max_len + s - 1) / s + BLK - 1) / BLK * BLK;
    const int ns = (a.max_len + len - 1) / len;
    const long long waves = (static_cast<long long>(a.B) * ns + sms - 1) / sms;
    const long long cost = waves * (len + FIXED_TOKENS);
    if (best_cost < 0 || cost < best_cost) { best_cost = cost; splits = ns; }
  }
  return splits;
}

}  // namespace

const char* mla_decode_output_name(MlaDecodeOutput o) {
  switch (o) {
    case MlaDecodeOutput::automatic: return "auto";
    case MlaDecodeOutput::direct: return "direct";
    case MlaDecodeOutput::combine: return "combine";
  }
  return "?";
}

MlaDecodeOutput mla_decode_output_rule(int num_splits) {
  return num_splits == 1 ? MlaDecodeOutput::direct : MlaDecodeOutput::combine;
}

MlaDecodePlan mla_decode_plan(const MlaDecodeArgs& a, const MlaDecodeOverrides* ov) {
  check_shapes(a, ov);
  int splits = ov && ov->num_splits > 0 ? ov->num_splits : auto_splits(a);
  // a forced count is clamped to [1, one slice per 32 tokens]; the rounding to whole blocks below then sets the count
  splits = std::max(1, std::min(splits, (a.max_len + 31) / 32));
  const int split_len = ((a.max_len + splits - 1) / splits + BLK - 1) / BLK * BLK;
  MlaDecodePlan p;
  p.split_len = split_len;
  p.num_splits = (a.max_len + split_len - 1) / split_len;
  const MlaDecodeOutput forced = ov ? ov->output : MlaDecodeOutput::automatic;
  if (forced == MlaDecodeOutput::direct && p.num_splits != 1)
    throw Error(std::string(OP) + ": overrides output = direct with " + std::to_string(p.num_splits) +
                " slices per sequence; accepted: direct only when the plan gives one slice (num_splits = 1)");
  p.output = forced == MlaDecodeOutput::automatic ? mla_decode_output_rule(p.num_splits) : forced;
  return p;
}

std::size_t mla_decode_workspace_bytes(const MlaDecodeArgs& a, const MlaDecodeOverrides* ov) {
  const MlaDecodePlan pl = mla_decode_plan(a, ov);
  return static_cast<std::size_t>(a.B) * pl.num_splits * a.H * (DC + 2) * 4;
}

}  // namespace kdalab::kernels
