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

/// The precision that runs: a.precision, or the rule's for a.s_q.
MlaDecodePrecision mla_decode_precision_of(const MlaDecodeArgs& a) {
  return a.precision == MlaDecodePrecision::automatic ? mla_decode_precision_rule(a.s_q) : a.precision;
}

/// CTAs per slice: the query rows in groups of 64 MMA rows (accurate: the H hi and H lo rows, one group; fast: s_q H
/// rows, two groups for H = 32 and s_q = 3, 4).
int groups_of(const MlaDecodeArgs& a) {
  return mla_decode_precision_of(a) == MlaDecodePrecision::accurate ? 1 : (a.s_q * a.H + 63) / 64;
}

void check_shapes(const MlaDecodeArgs& a, const MlaDecodeOverrides* ov) {
  auto fail = [](const std::string& m) { throw Error(std::string(OP) + ": " + m); };
  if (a.d_c != DC) fail("d_c = " + std::to_string(a.d_c) + " is not supported; accepted: d_c = 512");
  if (a.d_rope != 0)
    fail("d_rope = " + std::to_string(a.d_rope) +
         ": the decoupled-RoPE score part is not implemented yet; accepted: d_rope = 0 (NoPE)");
  if (a.H != 16 && a.H != 32) fail("H = " + std::to_string(a.H) + " is not supported; accepted: H = 16 or 32");
  if (a.s_q < 1 || a.s_q > 4)
    fail("s_q = " + std::to_string(a.s_q) + " query tokens per sequence is not supported; accepted: 1 <= s_q <= 4");
  const int pr = static_cast<int>(a.precision);
  if (pr < 0 || pr > 2)
    fail("precision = " + std::to_string(pr) + "; accepted: automatic (0), accurate (1) or fast (2)");
  if (a.precision == MlaDecodePrecision::accurate && a.s_q != 1)
    fail("precision = accurate with s_q = " + std::to_string(a.s_q) +
         "; accepted: accurate with s_q = 1 only (its hi and lo query rows fill the MMA rows); s_q > 1 runs fast "
         "(or automatic, which picks fast)");
  if (a.B < 1 || a.B > 65535) fail("B = " + std::to_string(a.B) + "; accepted: 1 <= B <= 65535");
  if (a.capacity < 1) fail("capacity = " + std::to_string(a.capacity) + "; accepted: >= 1 token");
  if (a.max_len < a.s_q || a.max_len > a.capacity)
    fail("max_len = " + std::to_string(a.max_len) + "; accepted: s_q = " + std::to_string(a.s_q) +
         " <= max_len <= capacity = " + std::to_string(a.capacity) +
         " (the s_q query tokens are the last cached ones; N = 0 or a context past the cache capacity)");
  if (!ov) return;
  if (ov->num_splits < 0)
    fail("overrides num_splits = " + std::to_string(ov->num_splits) + "; accepted: >= 0 (0 = automatic)");
  const int o = static_cast<int>(ov->output);
  if (o < 0 || o > 2)
    fail("overrides output = " + std::to_string(o) + "; accepted: automatic (0), direct (1) or combine (2)");
  if (ov->p_hi_only && mla_decode_precision_of(a) != MlaDecodePrecision::accurate)
    fail("overrides p_hi_only with precision = fast (s_q = " + std::to_string(a.s_q) +
         "); accepted: p_hi_only with the accurate precision only (fast has no P_lo rows to drop)");
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
/// of shared memory; `groups` CTAs per slice).
int auto_splits(const MlaDecodeArgs& a, int groups) {
  const int sms = sm_count();
  const long long ctas = static_cast<long long>(a.B) * groups;  // CTAs per slice index
  int splits = 1;
  long long best_cost = -1;
  const int smax = std::max(1, a.max_len / MIN_SPLIT);
  for (int s = 1; s <= std::min<long long>(smax, 4 * ((sms + ctas - 1) / ctas)); ++s) {
    const int len = ((a.max_len + s - 1) / s + BLK - 1) / BLK * BLK;
    const int ns = (a.max_len + len - 1) / len;
    const long long waves = (ctas * ns + sms - 1) / sms;
    const long long cost = waves * (len + FIXED_TOKENS);
    if (best_cost < 0 || cost < best_cost) { best_cost = cost; splits = ns; }
  }
  return splits;
}

}  // namespace

const char* mla_decode_precision_name(MlaDecodePrecision p) {
  switch (p) {
    case MlaDecodePrecision::automatic: return "auto";
    case MlaDecodePrecision::accurate: return "accurate";
    case MlaDecodePrecision::fast: return "fast";
  }
  return "?";
}

MlaDecodePrecision mla_decode_precision_rule(int s_q) {
  return s_q == 1 ? MlaDecodePrecision::accurate : MlaDecodePrecision::fast;
}

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
  const int groups = groups_of(a);
  int splits = ov && ov->num_splits > 0 ? ov->num_splits : auto_splits(a, groups);
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
  p.precision = mla_decode_precision_of(a);
  p.row_groups = groups;
  return p;
}

std::size_t mla_decode_workspace_bytes(const MlaDecodeArgs& a, const MlaDecodeOverrides* ov) {
  const MlaDecodePlan pl = mla_decode_plan(a, ov);
  return static_cast<std::size_t>(a.B) * pl.num_splits * a.s_q * a.H * (DC + 2) * 4;
}

}  // namespace kdalab::kernels
