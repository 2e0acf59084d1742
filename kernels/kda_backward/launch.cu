// KDA backward, host side: argument checks (the forward's check functions and messages), the workspace layout and
// the four launches (prepare, sweep, epilogue, params). API: kernels/kda_backward.hpp; design:
// docs/kernels/kda_backward.md.
#include <algorithm>
#include <string>
#include <utility>

#include "kernels/kda_backward/common.cuh"

namespace kdalab::kernels {

namespace {
using namespace kda_backward_detail;

constexpr const char* kOp = "kda_backward";

/// The shapes and options, checked (no pointers): the forward's checks and messages.
void check_shapes(const KdaBackwardArgs& a) {
  const std::string op = kOp;
  check_dim(a.D, kOp);
  if (a.T < 1) throw Error(op + ": T = " + std::to_string(a.T) + "; accepted: T >= 1");
  if (a.B < 1) throw Error(op + ": B = " + std::to_string(a.B) + "; accepted: B >= 1");
  if (a.H < 1 || a.HV < 1 || a.HV % a.H != 0)
    throw Error(op + ": H = " + std::to_string(a.H) + ", HV = " + std::to_string(a.HV) +
                "; accepted: H >= 1 and HV a positive multiple of H");
  if (!(a.scale > 0.0f)) throw Error(op + ": scale = " + std::to_string(a.scale) + "; accepted: scale > 0");
  if (a.cu_seqlens) {
    if (a.B != 1)
      throw Error(op + ": cu_seqlens given with B = " + std::to_string(a.B) +
                  "; accepted: B = 1 (sequences packed along T)");
    if (a.num_seqs < 1 || a.max_seqlen < 1 || a.max_seqlen > a.T)
      throw Error(op + ": cu_seqlens given with num_seqs = " + std::to_string(a.num_seqs) + ", max_seqlen = " +
                  std::to_string(a.max_seqlen) + "; accepted: num_seqs >= 1, 1 <= max_seqlen <= T");
  }
  const long long M = static_cast<long long>(a.B) * a.T;
  if (M * std::max(a.H, a.HV) > 0x7fffffffLL)
    throw Error(op + ": B T HV = " + std::to_string(M * a.HV) + " token rows x heads; accepted: < 2^31");
}

/// Workspace regions, byte offsets from its start (each rounded up to 256 bytes); the regions of the other pass are 0
/// bytes long.
struct Layout {
  std::size_t qn, kn, qinv, kinv, gf, bf, ckpt, scratch, fac, Sst, dSst, pq, pk, pg, pb, pA, total;
  int grid, P;
};

/// The chunked pass in either form (its chains on mma or on wgmma).
bool is_chunked(KdaBackwardPass pass) {
  return pass == KdaBackwardPass::chunked || pass == KdaBackwardPass::chunked_wg;
}

/// The chunked passes finish the rows in their gradient kernel (Params::tail_in_grad) where HV = H.
bool tail_in_grad(const KdaBackwardArgs& a, KdaBackwardPass pass, const KdaBackwardOverrides* ov) {
  return is_chunked(pass) && a.HV == a.H && !(ov && ov->separate_epilogue);
}

Layout layout_of(const KdaBackwardArgs& a, KdaBackwardPass pass, bool tail) {
  const bool chunked = is_chunked(pass);
  const std::size_t M = static_cast<std::size_t>(a.B) * a.T, H = a.H, HV = a.HV, D = a.D;
  const std::size_t N = a.cu_seqlens ? a.num_seqs : a.B;
  const std::size_t slots = chunked ? 0 : a.cu_seqlens ? N + a.T / CK + 1 : N * ((a.T + CK - 1) / CK);
  const std::size_t cslots =
      !chunked ? 0 : a.cu_seqlens ? N + a.T / CHUNK + 1 : N * ((a.T + CHUNK - 1) / CHUNK);
  const std::size_t P = chunked ? 1 : cfg_p(a.D), NC = cfg_nc(a.D);
  const std::size_t items = N * HV * P;
  const int grid = chunked ? 0 : static_cast<int>(std::min<std::size_t>(items, sweep_resident_ctas(a.D)));
  Layout l{};
  l.grid = grid;
  l.P = static_cast<int>(P);
  std::size_t off = 0;
  const auto take = [&](std::size_t floats) {
    const std::size_t o = off;
    off += (floats * 4 + 255) / 256 * 256;
    return o;
  };
  l.qn = take(M * H * D);
  l.kn = take(M * H * D);
  l.qinv = take(M * H);
  l.kinv = take(M * H);
  l.gf = take(M * HV * D);
  l.bf = take(M * HV);
  l.ckpt = take(slots * HV * D * D);
  l.scratch = take(static_cast<std::size_t>(grid) * SCRATCH_TILES * D * NC);
  l.fac = take(cslots * HV * (chunked ? chunked_factor_floats(a.D) : 0));
  l.Sst = take(cslots * HV * D * D);
  l.dSst = take(cslots * HV * D * D);
  l.pq = take(tail ? 0 : P * M * HV * D);
  l.pk = take(tail ? 0 : P * M * HV * D);
  l.pg = take(P * M * HV * D);
  l.pb = take(tail ? 0 : P * M * HV);
  l.pA = take(M * HV);
  l.total = off;
  return l;
}

}  // namespace

KdaBackwardPass kda_backward_plan(const KdaBackwardArgs& a, const KdaBackwardOverrides* ov) {
  check_shapes(a);
  const KdaBackwardPass forced = ov ? ov->pass : KdaBackwardPass::automatic;
  const int N = a.cu_seqlens ? a.num_seqs : a.B;
  const bool fits = a.D != 256 && N <= 65535;  // the chunked grids put the sequence in gridDim.z
  if (forced == KdaBackwardPass::chunked && !fits)
    throw Error(std::string(kOp) + ": pass = chunked with D = " + std::to_string(a.D) + " and " + std::to_string(N) +
                " sequences; accepted: the chunked pass with D = 64 or 128 and at most 65535 sequences, the sweep "
                "with any D and any number");
  if (forced == KdaBackwardPass::chunked_wg && !(fits && a.D == 128))
    throw Error(std::string(kOp) + ": pass = chunked_wg with D = " + std::to_string(a.D) + " and " +
                std::to_string(N) + " sequences; accepted: the chunked_wg pass with D = 128 and at most 65535 "
                "sequences, the chunked pass with D = 64 or 128, the sweep with any D and any number");
  if (forced != KdaBackwardPass::automatic) return forced;
  if (!fits) return KdaBackwardPass::sweep;
  return a.D == 128 ? KdaBackwardPass::chunked_wg : KdaBackwardPass::chunked;
}

std::size_t kda_backward_workspace_bytes(const KdaBackwardArgs& a, const KdaBackwardOverrides* ov) {
  const KdaBackwardPass pass = kda_backward_plan(a, ov);
  return layout_of(a, pass, tail_in_grad(a, pass, ov)).total;
}

void kda_backward(const KdaBackwardArgs& a, cudaStream_t stream, const KdaBackwardOverrides* ov) {
  const KdaBackwardPass pass = kda_backward_plan(a, ov);
  check_gate(a.gate, a.HV, kOp);
  const int D = a.D;
  check_ptr(a.q, 16, "q");
  check_ptr(a.k, 16, "k");
  check_ptr(a.v, 16, "v");
  check_ptr(a.g, 16, "g");
  check_ptr(a.beta, 2, "beta");
  check_ptr(a.dO, 16, "dO");
  check_ptr(a.S0, 16, "S0", false);
  check_ptr(a.dS_T, 16, "dS_T", false);
  // dq, dk, dg, dbeta: the bf16 outputs, or all four fp32 ones instead (KdaBackwardArgs::dq_f32)
  const bool f32 = a.dq_f32 || a.dk_f32 || a.dg_f32 || a.dbeta_f32;
  if (f32 && (a.dq || a.dk || a.dg || a.dbeta))
    throw Error(std::string("kda_backward: dq_f32 ... and dq ... both given; accepted: the bf16 dq, dk, dg, dbeta or "
                            "the fp32 dq_f32, dk_f32, dg_f32, dbeta_f32, not both"));
  check_ptr(f32 ? static_cast<const void*>(a.dq_f32) : a.dq, 16, f32 ? "dq_f32" : "dq");
  check_ptr(f32 ? static_cast<const void*>(a.dk_f32) : a.dk, 16, f32 ? "dk_f32" : "dk");
  check_ptr(a.dv, 16, "dv");
  check_ptr(f32 ? static_cast<const void*>(a.dg_f32) : a.dg, 16, f32 ? "dg_f32" : "dg");
  check_ptr(f32 ? static_cast<const void*>(a.dbeta_f32) : a.dbeta, f32 ? 4 : 2, f32 ? "dbeta_f32" : "dbeta");
  check_ptr(a.dS0, 16, "dS0", false);
  if (a.gate.fused) {
    check_ptr(a.dA_log, 4, "dA_log");
    check_ptr(a.dbias, 4, "dbias");
  }
  if (a.cu_seqlens) check_ptr(a.cu_seqlens, 4, "cu_seqlens");
  check_ptr(a.workspace, 16, "workspace");
  const bool tail = tail_in_grad(a, pass, ov);
  const Layout l = layout_of(a, pass, tail);
  if (a.workspace_bytes < l.total)
    throw Error(std::string(kOp) + ": workspace_bytes = " + std::to_string(a.workspace_bytes) +
                "; accepted: >= " + std::to_string(l.total) + " (kda_backward_workspace_bytes() of the same pass)");

  Params p{};
  p.B = a.B; p.T = a.T; p.H = a.H; p.HV = a.HV; p.group = a.HV / a.H; p.D = D;
  p.N = a.cu_seqlens ? a.num_seqs : a.B;
  p.P = l.P;
  p.M = a.B * a.T;
  p.max_len = a.cu_seqlens ? a.max_seqlen : a.T;
  p.q = a.q; p.k = a.k; p.v = a.v; p.g = a.g; p.beta = a.beta; p.dO = a.dO;
  const KdaInputStrides in = resolve_input_strides(a, D);
  p.sq = in.q; p.sk = in.k; p.sv = in.v; p.sg = in.g; p.sbeta = in.beta;
  p.sdo = resolve_strides(a.sdo, a.T, a.HV, D);
  check_strides(p.sdo, "dO");
  p.A_log = a.gate.A_log; p.bias = a.gate.bias; p.g_min = a.gate.g_min; p.scale = a.scale;
  p.fuse_gate = a.gate.fused; p.l2norm = a.l2norm_qk; p.beta_sigmoid = a.beta_sigmoid;
  p.S0 = a.S0; p.dS_T = a.dS_T; p.cu = a.cu_seqlens;
  p.dq = a.dq; p.dk = a.dk; p.dv = a.dv; p.dg = a.dg; p.dbeta = a.dbeta;
  p.dq32 = a.dq_f32; p.dk32 = a.dk_f32; p.dg32 = a.dg_f32; p.dbeta32 = a.dbeta_f32;
  p.dA_log = a.dA_log; p.dbias = a.dbias; p.dS0 = a.dS0;
  auto* ws = static_cast<unsigned char*>(a.workspace);
  const auto f = [&](std::size_t off) { return reinterpret_cast<float*>(ws + off); };
  p.qn = f(l.qn); p.kn = f(l.kn); p.qinv = f(l.qinv); p.kinv = f(l.kinv); p.gf = f(l.gf); p.bf = f(l.bf);
  p.ckpt = f(l.ckpt); p.scratch = f(l.scratch);
  p.fac = f(l.fac); p.Sst = f(l.Sst); p.dSst = f(l.dSst);
  // with the gradient kernel's tail the dq, dk, dbeta partials have no region (null: a stray write faults at once)
  p.pq = tail ? nullptr : f(l.pq); p.pk = tail ? nullptr : f(l.pk); p.pb = tail ? nullptr : f(l.pb);
  p.pg = f(l.pg); p.pA = f(l.pA);
  p.tail_in_grad = tail;

  const KdaBackwardPhase last = ov ? ov->last : KdaBackwardPhase::all;
  launch_prepare(p, stream);
  if (last == KdaBackwardPhase::prepare) return;
  if (is_chunked(pass))
    launch_chunked(p, stream, last, pass == KdaBackwardPass::chunked_wg);
  else launch_sweep(p, l.grid, stream);
  if (last != KdaBackwardPhase::all) return;
  launch_epilogue(p, stream);
}

}  // namespace kdalab::kernels
