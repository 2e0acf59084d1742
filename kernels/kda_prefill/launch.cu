// KDA prefill, host side: argument checks, the rule (kda_prefill_plan), the workspace, and the schedules (one-shot,
// overlapped one-shot, segment path) over the kernels of prepare.cu, state_*.cu and segments.cu. The public API and
// the rule's reasons: kernels/kda.hpp; versions and measurements: docs/kernels/kda_prefill.md.
#include <algorithm>
#include <string>
#include <vector>

#include "kernels/kda_prefill/common.cuh"
#include "kernels/kda_prefill/segments.hpp"

namespace kdalab::kernels {

namespace {
using namespace kda_prefill_detail;

struct Checked {
  Params p;
  int N, max_chunks;
  long long slots;
};

Checked check_prefill(const KdaPrefillArgs& a) {
  const char* op = "kda_prefill";
  check_dim(a.D, op);
  const int D = a.D;
  if (a.T < 1) throw Error(std::string(op) + ": T = " + std::to_string(a.T) + "; accepted: T >= 1");
  if (a.B < 1) throw Error(std::string(op) + ": B = " + std::to_string(a.B) + "; accepted: B >= 1");
  if (a.H < 1 || a.HV < 1 || a.HV % a.H != 0)
    throw Error(std::string(op) + ": H = " + std::to_string(a.H) + ", HV = " + std::to_string(a.HV) +
                "; accepted: H >= 1 and HV a positive multiple of H");
  if (!(a.scale > 0.0f)) throw Error(std::string(op) + ": scale = " + std::to_string(a.scale) + "; accepted: scale > 0");
  check_gate(a.gate, a.HV, op);
  check_ptr(a.q, 16, "q");
  check_ptr(a.k, 16, "k");
  check_ptr(a.v, 16, "v");
  check_ptr(a.g, 16, "g");
  check_ptr(a.beta, 2, "beta");
  check_ptr(a.o, 16, "o");
  check_ptr(a.S0, 16, "S0", false);
  check_ptr(a.S_final, 16, "S_final", false);
  check_ptr(a.workspace, 16, "workspace", false);
  Checked ck{};
  Params& p = ck.p;
  p.B = a.B; p.T = a.T; p.H = a.H; p.HV = a.HV; p.group = a.HV / a.H;
  p.q = a.q; p.k = a.k; p.v = a.v; p.g = a.g; p.beta = a.beta; p.o = a.o;
  const KdaInputStrides in = resolve_input_strides(a, D);
  p.sq = in.q; p.sk = in.k; p.sv = in.v; p.sg = in.g; p.sbeta = in.beta;
  p.so = resolve_strides(a.so, a.T, a.HV, D);
  check_strides(p.so, "o");
  p.A_log = a.gate.A_log; p.bias = a.gate.bias; p.g_min = a.gate.g_min; p.scale = a.scale;
  p.fuse_gate = a.gate.fused; p.l2norm = a.l2norm_qk; p.beta_sigmoid = a.beta_sigmoid;
  p.write_p = false;
  p.S0 = a.S0; p.S_final = a.S_final; p.cu = a.cu_seqlens;
  if (a.cu_seqlens) {
    check_ptr(a.cu_seqlens, 4, "cu_seqlens");
    if (a.B != 1)
      throw Error(std::string(op) + ": cu_seqlens given with B = " + std::to_string(a.B) +
                  "; accepted: B = 1 (sequences packed along T)");
    if (a.num_seqs < 1 || a.max_seqlen < 1 || a.max_seqlen > a.T)
      throw Error(std::string(op) + ": cu_seqlens given with num_seqs = " + std::to_string(a.num_seqs) +
                  ", max_seqlen = " + std::to_string(a.max_seqlen) + "; accepted: num_seqs >= 1, 1 <= max_seqlen <= T");
    ck.N = a.num_seqs;
    ck.max_chunks = (a.max_seqlen + C - 1) / C;
    ck.slots = static_cast<long long>(a.num_seqs) + a.T / C + 1;
    p.nchunk_fixed = 0;
  } else {
    ck.N = a.B;
    ck.max_chunks = (a.T + C - 1) / C;
    ck.slots = static_cast<long long>(a.B) * ck.max_chunks;
    p.nchunk_fixed = ck.max_chunks;
  }
  p.N = ck.N;
  p.nseg_grid = 1;
  p.seg_chunks = 1 << 30;
  p.seg_base = 0;
  p.chunk_base = 0;
  p.seg_S = p.seg_A = p.seg_B = nullptr;
  p.ws_lo = nullptr;
  return ck;
}

/// Parts of the overlapped schedule (KdaPrefillPlan::overlapped): fixed-length batches with T >= 2048 are cut into
/// K0 = min(8, max(2, T / 2048)) parts of a multiple of 128 tokens (kda_value_scale_period chunks) (>= ~2048 tokens each; an H200 sweep of K at
/// T = 8192: K = 4 beat T / 1024 = 8 by 3-4% (H = 64: 0.785 vs 0.817 ms, H = 96: 1.166 vs 1.202), K = 2 beat 4 at
/// B = 4 x 4096, and K = 8 is best at T = 65536 (3.455 ms; K = 4: 3.568, K = 16: 3.46; docs/kernels/kda_prefill.md,
/// "Segment count of the overlapped schedule");
/// the prepare kernel of part k + 1 (caller's stream) runs while the state pass of part k runs (a side stream of
/// higher priority); the state crosses parts through an fp32 buffer, which is exact (the same fp32 values the
/// registers held).
struct Segments {
  int K = 1, seg = 0;
};
Segments segments_of(const KdaPrefillArgs& a) {
  Segments sg;
  sg.seg = a.T;
  if (a.cu_seqlens || a.single_stream || a.T < 2048) return sg;
  const int K0 = std::min(8, std::max(2, a.T / 2048));
  constexpr int step = C * kda_value_scale_period;  // the accurate value scale's period (128 tokens)
  sg.seg = ((a.T + K0 - 1) / K0 + step - 1) / step * step;
  sg.K = (a.T + sg.seg - 1) / sg.seg;
  return sg;
}
std::size_t state_buffer_bytes(const KdaPrefillArgs& a, const Segments& sg) {
  return sg.K > 1 ? static_cast<std::size_t>(a.B) * a.HV * a.D * a.D * 4 : 0;
}

/// SMs of the current device (queried once per device).
int sm_count() {
  static int cache[64] = {};
  int dev = 0;
  cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
  int sms = dev < 64 ? cache[dev] : 0;
  if (sms == 0) {
    cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
    if (dev < 64) cache[dev] = sms;
  }
  return sms;
}

/// A side stream of the greatest priority forked from `stream` (it first waits for everything enqueued on
/// `stream` so far) and n events for the caller's cross-stream edges: link(i, from, to) makes `to` wait for
/// what `from` has enqueued so far (event i < n); join() makes `stream` wait for the side stream. The stream
/// and the events are destroyed with the object (also when a launch throws; queued work still completes).
class SideStream {
 public:
  SideStream(cudaStream_t stream, int n) : stream_(stream), ev_(n + 2, nullptr) {
    int prio_least = 0, prio_greatest = 0;
    cuda_check(cudaDeviceGetStreamPriorityRange(&prio_least, &prio_greatest), "cudaDeviceGetStreamPriorityRange");
    cuda_check(cudaStreamCreateWithPriority(&side_, cudaStreamNonBlocking, prio_greatest), "cudaStreamCreateWithPriority");
    try {
      for (auto& e : ev_) cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
      link(n, stream_, side_);
    } catch (...) {
      release();
      throw;
    }
  }
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;
  ~SideStream() { release(); }
  cudaStream_t side() const { return side_; }
  void link(int i, cudaStream_t from, cudaStream_t to) {
    cuda_check(cudaEventRecord(ev_[i], from), "cudaEventRecord");
    cuda_check(cudaStreamWaitEvent(to, ev_[i], 0), "cudaStreamWaitEvent");
  }
  void join() { link(static_cast<int>(ev_.size()) - 1, side_, stream_); }

 private:
  void release() {
    for (auto& e : ev_)
      if (e) cudaEventDestroy(e);
    if (side_) cudaStreamDestroy(side_);
  }
  cudaStream_t stream_ = nullptr, side_ = nullptr;
  std::vector<cudaEvent_t> ev_;
};

/// The wave model of the segment path (the automatic schedule): only for fixed-length batches when the one-shot
/// pass has at most one CTA per SM (N * HV * D / 32 <= SMs: 2 warps per SM, latency-bound) and >= 1024 chunks
/// (T >= 16384). Cost model in us per chunk step, from H200 runs of the mma pass: a step takes t(k) = 1.27, 1.38, 1.73,
/// 2.1 us with k = 1, 2, 3, 4 state CTAs per SM (8192x64: 2/SM 0.706 ms / 512 steps; 8192x96: 2.9/SM 0.884 ms / 512;
/// 65536x32: 1/SM 5.196 ms / 4096; 4 is extrapolated), at most 4 CTAs per SM (51 KB of smem each), more make waves.
/// Pass 1 steps weigh 0.75 (no Qg S, P D, o; half the bytes). P in 2..16 minimising pass 1 + pass 2 is taken when it
/// is below 0.9 of the one-shot pass (both schedules overlap the prepare with state work: the overlapped schedule hid
/// ~0.7 ms of the 2.9 ms prepare at 65536x32). Pass 1 = segment 0's full pass (N HV D / 32 CTAs, weight 1) + segments
/// 1..P-2 (2 N HV D / 32 CTAs each, weight 0.75); pass 2 = segments 1..P-1. H = 32, T = 65536 on 132 SMs: P = 3, model
/// 3.85 ms vs 5.2 ms one-shot (0.74). Returns 0 where the one-shot pass is kept.
double pass_cost(long long ctas, int sms, double steps) {
  static const double t[5] = {0.0, 1.27, 1.38, 1.73, 2.1};
  const long long per_sm = (ctas + sms - 1) / sms;
  if (per_sm <= 4) return steps * t[per_sm];
  return static_cast<double>((per_sm + 3) / 4) * steps * t[4];
}
int wave_model_segments(const KdaPrefillArgs& a, int N, int nch) {
  const int sms = sm_count();
  const long long base = static_cast<long long>(N) * a.HV * (a.D / SLICE);  // one-shot state CTAs
  if (base > sms || nch < 1024) return 0;
  double best = 0.9 * pass_cost(base, sms, nch);
  int P = 0;
  for (int q = 2; q <= 16; ++q) {
    const double L = (nch + q - 1) / q;
    // pass 1: segment 0 full (base CTAs) + segments 1..q-2 (2 base CTAs each, lighter); pass 2: q - 1 segments
    const double w1 = (1.0 + 0.75 * 2 * (q - 2)) / (1.0 + 2 * (q - 2));
    const double cost = w1 * pass_cost((1 + 2LL * (q - 2)) * base, sms, L) + pass_cost((q - 1) * base, sms, L);
    if (cost < best) {
      best = cost;
      P = q;
    }
  }
  return P;
}

const char* name_of(KdaStatePass s) {
  switch (s) {
    case KdaStatePass::automatic: return "automatic";
    case KdaStatePass::mma: return "mma";
    case KdaStatePass::key_split: return "key_split";
    case KdaStatePass::wgmma: return "wgmma";
  }
  return "?";
}

/// KdaPrefillPlan::state_sm_reserved: the overlapped wgmma pass whose CTAs (64 value columns of a value head each)
/// fill at most half the SMs.
bool reserve_state_sms(const KdaPrefillPlan& pl, int N, int HV) {
  return pl.overlapped && pl.state_pass == KdaStatePass::wgmma && 2LL * N * HV * 2 <= sm_count();
}

/// The plan and the segment length of the segment path (chunks per segment; 0 for one-shot).
struct Plan {
  KdaPrefillPlan pub;
  int seg_chunks = 0;
};

/// The rule (kernels/kda.hpp, kda_prefill_plan) for N sequences of at most nch chunks.
Plan plan_of(const KdaPrefillArgs& a, const KdaPrefillOverrides* o, int N, int nch) {
  const KdaPrefillOverrides ov = o ? *o : KdaPrefillOverrides{};
  const char* op = "kda_prefill";
  const std::string pass = name_of(ov.state_pass);
  if ((ov.state_pass == KdaStatePass::key_split && a.D != 256) ||
      (ov.state_pass == KdaStatePass::wgmma && a.D != 128) || (ov.state_pass == KdaStatePass::mma && a.D == 256))
    throw Error(std::string(op) + ": overrides.state_pass = " + pass + " with D = " + std::to_string(a.D) +
                "; accepted: automatic, mma (D = 64, 128), wgmma (D = 128), key_split (D = 256)");
  if (ov.schedule == KdaSchedule::segments) {
    if (ov.segments < 2 || ov.segments > 64)
      throw Error(std::string(op) + ": overrides.segments = " + std::to_string(ov.segments) +
                  " with schedule = segments; accepted: 2..64");
    if (a.D == 256 || a.cu_seqlens || ov.state_pass == KdaStatePass::wgmma)
      throw Error(std::string(op) + ": overrides.schedule = segments with D = " + std::to_string(a.D) +
                  (a.cu_seqlens ? ", cu_seqlens" : "") + ", state_pass = " + pass +
                  "; accepted: D = 64 or 128, fixed-length sequences (no cu_seqlens), state_pass automatic or mma");
  }
  Plan r;
  KdaPrefillPlan& pl = r.pub;
  pl.precision = a.precision;
  if (a.precision == KdaPrecision::accurate) {
    // the lo parts exist only in the wgmma pass (D = 128, one-shot): the rule takes it, forcing anything else is refused
    if (a.D != 128)
      throw Error(std::string(op) + ": precision = accurate with D = " + std::to_string(a.D) +
                  "; accepted: D = 128 (precision = fast at D = 64, 256)");
    if ((ov.state_pass != KdaStatePass::automatic && ov.state_pass != KdaStatePass::wgmma) ||
        ov.schedule == KdaSchedule::segments)
      throw Error(std::string(op) + ": precision = accurate with overrides.state_pass = " + pass +
                  (ov.schedule == KdaSchedule::segments ? ", schedule = segments" : "") +
                  "; accepted: state_pass automatic or wgmma, schedule automatic or one_shot");
    pl.state_pass = KdaStatePass::wgmma;
    pl.overlapped = segments_of(a).K > 1 && ov.phases == KdaPhases::both;
    pl.state_sm_reserved = reserve_state_sms(pl, N, a.HV);
    return r;
  }
  if (a.precision != KdaPrecision::fast)
    throw Error(std::string(op) + ": precision = " + std::to_string(static_cast<int>(a.precision)) +
                "; accepted: KdaPrecision::fast or accurate");
  int P = 1;
  if (a.D != 256) {
    if (ov.schedule == KdaSchedule::segments) P = ov.segments;
    else if (ov.schedule == KdaSchedule::automatic && !a.cu_seqlens && ov.state_pass != KdaStatePass::wgmma)
      P = std::max(1, wave_model_segments(a, N, nch));
    if (P > 1) {
      r.seg_chunks = (nch + P - 1) / P;
      P = (nch + r.seg_chunks - 1) / r.seg_chunks;
    }
    // the rule at D = 128: the one-shot wgmma pass where the wave model's P is 1, 2 or 3
    if (a.D == 128 && ov.schedule == KdaSchedule::automatic && ov.state_pass == KdaStatePass::automatic && P <= 3) P = 1;
    if (P < 2) {
      P = 1;
      r.seg_chunks = 0;
    }
  }
  pl.segments = P;
  pl.schedule = P > 1 ? KdaSchedule::segments : KdaSchedule::one_shot;
  if (a.D == 256) pl.state_pass = KdaStatePass::key_split;
  else if (P > 1) pl.state_pass = KdaStatePass::mma;
  else if (ov.state_pass != KdaStatePass::automatic) pl.state_pass = ov.state_pass;
  else pl.state_pass = a.D == 128 ? KdaStatePass::wgmma : KdaStatePass::mma;
  pl.overlapped = P == 1 && segments_of(a).K > 1 && ov.phases == KdaPhases::both;
  pl.state_sm_reserved = reserve_state_sms(pl, N, a.HV);
  return r;
}

std::size_t seg_buffer_bytes(const KdaPrefillArgs& a, int N, int P) {
  return P > 1 ? 3ull * (P - 1) * N * a.HV * a.D * a.D * 4 : 0;
}

/// The plan of `a` from its shapes and options alone (no pointer checks), for kda_prefill_plan.
Plan query_plan(const KdaPrefillArgs& a, const KdaPrefillOverrides* o) {
  const char* who = "kda_prefill_plan";
  check_dim(a.D, who);
  if (a.T < 1 || a.B < 1 || a.HV < 1 || (a.cu_seqlens && (a.num_seqs < 1 || a.max_seqlen < 1)))
    throw Error(std::string(who) + ": T = " + std::to_string(a.T) + ", B = " + std::to_string(a.B) + ", HV = " +
                std::to_string(a.HV) + "; accepted: T, B, HV >= 1 (and num_seqs, max_seqlen >= 1 with cu_seqlens)");
  const int N = a.cu_seqlens ? a.num_seqs : a.B;
  const int nch = ((a.cu_seqlens ? a.max_seqlen : a.T) + C - 1) / C;
  return plan_of(a, o, N, nch);
}
}  // namespace

KdaPrefillPlan kda_prefill_plan(const KdaPrefillArgs& a, const KdaPrefillOverrides* o) { return query_plan(a, o).pub; }

/// The accurate precision's lo region (after the slots and the state or segment buffers).
std::size_t lo_region_bytes(const KdaPrefillArgs& a, const Checked& ck) {
  return a.precision == KdaPrecision::accurate ? static_cast<std::size_t>(ck.slots) * a.HV * kda_slot_lo_bytes : 0;
}

std::size_t kda_prefill_workspace_bytes(const KdaPrefillArgs& a, const KdaPrefillOverrides* o) {
  const Checked ck = check_prefill(a);
  const int P = plan_of(a, o, ck.N, ck.max_chunks).pub.segments;
  return static_cast<std::size_t>(ck.slots) * a.HV * kda_slot_bytes(a.D) +
         (P > 1 ? seg_buffer_bytes(a, ck.N, P) : state_buffer_bytes(a, segments_of(a))) + lo_region_bytes(a, ck);
}

void kda_prefill(const KdaPrefillArgs& a, cudaStream_t stream, const KdaPrefillOverrides* o) {
  Checked ck = check_prefill(a);
  const Plan pr = plan_of(a, o, ck.N, ck.max_chunks);
  const KdaPrefillPlan& pl = pr.pub;
  const Segments sg = segments_of(a);
  const std::size_t slot_bytes = static_cast<std::size_t>(ck.slots) * a.HV * kda_slot_bytes(a.D);
  const std::size_t before_lo =
      slot_bytes + (pl.segments > 1 ? seg_buffer_bytes(a, ck.N, pl.segments) : state_buffer_bytes(a, sg));
  const std::size_t need = before_lo + lo_region_bytes(a, ck);
  if (!a.workspace || a.workspace_bytes < need)
    throw Error("kda_prefill: workspace of " + std::to_string(a.workspace_bytes) + " bytes at " +
                (a.workspace ? "a valid pointer" : "null") + "; accepted: a 16-byte aligned device buffer of >= " +
                std::to_string(need) + " bytes (kda_prefill_workspace_bytes())");
  ck.p.ws = static_cast<unsigned char*>(a.workspace);
  if (a.precision == KdaPrecision::accurate) ck.p.ws_lo = ck.p.ws + before_lo;
  if (ck.N > 65535 || a.HV > 65535)
    throw Error("kda_prefill: " + std::to_string(ck.N) + " sequences x " + std::to_string(a.HV) +
                " value heads; accepted: each <= 65535 (grid limits)");
  const KdaPhases phases = o ? o->phases : KdaPhases::both;
  const bool run_prepare = phases != KdaPhases::state, run_state = phases != KdaPhases::prepare;
  if (pl.segments > 1) {  // the segment path: prepare, pass 1, combine, pass 2 (D = 64, 128)
    run_segment_path(SegmentRun{ck.p, a.D, a.HV, ck.N, ck.max_chunks, pl.segments, pr.seg_chunks, slot_bytes,
                                run_prepare, run_state},
                     stream);
    return;
  }
  const bool wgl = pl.state_pass == KdaStatePass::wgmma;  // the prepare writes the wgmma slot layout
  auto state = [&](const Params& p, cudaStream_t s) {
    if (pl.state_pass == KdaStatePass::key_split) launch_state_key_split(p, a.HV, ck.N, s);
    else if (wgl) launch_state_wgmma(p, a.HV, ck.N, s, pl.state_sm_reserved);
    else launch_state_mma(p, a.D, a.HV, ck.N, s);
  };
  if (!pl.overlapped) {
    if (run_prepare) launch_prepare(ck.p, dim3(ck.max_chunks, a.HV, ck.N), a.D, wgl, stream);
    if (run_state) state(ck.p, stream);
    return;
  }
  // the overlapped schedule (see segments_of)
  SideStream ss(stream, sg.K);
  const cudaStream_t side = ss.side();
  float* sbuf = reinterpret_cast<float*>(static_cast<unsigned char*>(a.workspace) + slot_bytes);
  const int seg_chunks = sg.seg / C;
  for (int k = 0; k < sg.K; ++k) {
    const long long t0 = static_cast<long long>(k) * sg.seg;
    const int Tk = static_cast<int>(std::min<long long>(sg.seg, a.T - t0));
    Params p = ck.p;
    p.T = Tk;
    p.nchunk_fixed = (Tk + C - 1) / C;
    p.q += t0 * p.sq.t;
    p.k += t0 * p.sk.t;
    p.v += t0 * p.sv.t;
    p.g += t0 * p.sg.t;
    p.beta += t0 * p.sbeta.t;
    p.o += t0 * p.so.t;
    p.ws = ck.p.ws + static_cast<std::size_t>(k) * a.B * seg_chunks * a.HV * kda_slot_bytes(a.D);
    if (ck.p.ws_lo) p.ws_lo = ck.p.ws_lo + static_cast<std::size_t>(k) * a.B * seg_chunks * a.HV * kda_slot_lo_bytes;
    p.S0 = k == 0 ? a.S0 : sbuf;
    p.S_final = k == sg.K - 1 ? a.S_final : sbuf;
    launch_prepare(p, dim3(p.nchunk_fixed, a.HV, ck.N), a.D, wgl, stream);
    ss.link(k, stream, side);
    state(p, side);
  }
  ss.join();
}
}  // namespace kdalab::kernels
