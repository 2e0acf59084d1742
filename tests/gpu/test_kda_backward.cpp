// The CUDA KDA backward (kernels/kda_backward.hpp) against the float64 oracle (reference/kda_backward.hpp, with the
// chain rules of the L2Norm, the beta sigmoid and the K3 gate as reference/kda_fused_backward.hpp composes them) on
// fresh seeded inputs rounded to what the kernel reads (bf16 tensors, fp32 gate parameters and states); every output
// and the workspace poisoned (NaN) before each run. Runs only where the CUDA kernels are built (ctest label gpu).
//
// The accuracy cases are one table (BwdCase: the problem's shape and switches) and one check function (check_bwd):
// every gradient within tol::kda_bwd_bf16 (bf16 outputs) or tol::kda_bwd_f32 (fp32 outputs) relative RMS of the
// oracle, no NaN / Inf, and each bf16 gradient's error within 10% of the kernel twin's (numerics/kda_backward_twin.hpp:
// the same problem in fp32 with the kernel's output rounding). Each comparison prints one line (relative RMS, the
// twin's, the tensor's own bf16 rounding floor, the largest error and where, the first element off by more than
// 8 tol RMS(ref)), so a failing run says which gradient, token, head and row went wrong.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/kda_backward.hpp"
#include "numerics/kda_backward_twin.hpp"
#include "numerics/kda_chunk_backward_twin.hpp"
#include "numerics/bf16.hpp"
#include "numerics/metrics.hpp"
#include "numerics/random.hpp"
#include "numerics/tolerance.hpp"
#include "tests/catch.hpp"
#include "tests/gpu/kda_gpu_util.hpp"

using namespace kdalab;
using kda_gpu::DevBuf;
using kda_gpu::download_bf16;
using kda_gpu::download_f32;
using kda_gpu::upload_bf16;
using kda_gpu::upload_f32;
using kernels::bf16_t;
using kernels::cuda_check;

namespace {

std::uint64_t fresh_seed() {
  static std::uint64_t s = 20261205;
  return ++s;
}

/// One backward problem: shape, packing and the pre-op switches.
struct BwdCase {
  std::size_t B = 1, T = 1, H = 1, group = 1, D = 128;
  std::vector<int> lens;  // varlen (cu_seqlens) when not empty: B = 1, T = the sum, one S0 / dS_T per sequence
  bool fused = true;      // K3 gate fused (g = raw logits); false: g is the log-decay in [-5, 0]
  bool l2norm = true, beta_sigmoid = true;
  bool S0 = true, dS_T = false;
  bool twice = false;  // a second run on the same inputs gives the same bits (the deterministic reduction)
  std::size_t pad = 0;  // elements after each token row of v and dO (a multiple of 8, NaN-filled): strided inputs

  std::string name() const {
    std::string s = "D=";  // appended piece by piece: GCC 12's -Wrestrict misfires on "lit" + std::string&&
    std::size_t tokens = 0;  // varlen: the packed total
    for (int l : lens) tokens += static_cast<std::size_t>(l);
    if (lens.empty()) tokens = T;
    for (const auto& [key, val] : {std::pair<const char*, std::size_t>{"", D}, {" B=", B}, {" T=", tokens}, {" H=", H},
                                   {" HV=", H * group}}) {
      s += key;
      s += std::to_string(val);
    }
    if (!lens.empty()) {
      s += " varlen";
      for (int l : lens) {
        s += ' ';
        s += std::to_string(l);
      }
    }
    s += fused ? " gate=fused" : " gate=given";
    s += l2norm ? " l2norm" : " no-l2norm";
    s += beta_sigmoid ? " beta=sigmoid" : " beta=given";
    s += S0 ? " S0" : " noS0";
    s += dS_T ? " dS_T" : " no-dS_T";
    if (pad) s += " v,dO rows padded by " + std::to_string(pad);
    return s;
  }
};

BwdCase shape(std::size_t B, std::size_t T, std::size_t H, std::size_t group, std::size_t D) {
  BwdCase c;
  c.B = B; c.T = T; c.H = H; c.group = group; c.D = D;
  return c;
}

/// The inputs as the kernel reads them and the upstream gradients (numerics/kda_backward_twin.hpp's draw).
using Problem = KdaBwdProblem;
using Grads = KdaBwdGrads;

Problem make_problem(const BwdCase& c, std::uint64_t seed) {
  return kda_backward_problem(c.B, c.T, c.H, c.group, c.D, c.lens, c.fused, c.l2norm, c.beta_sigmoid, c.S0, c.dS_T,
                              seed);
}

/// The float64 gradients of the problem (the kernel's output set).
Grads oracle(const Problem& p) { return kda_backward_kernel_form<double>(p); }

/// Index of a flat element as its coordinates, e.g. "[0, 17, 1, 42]".
std::string coords(std::size_t idx, const std::vector<std::size_t>& shape) {
  std::vector<std::size_t> c(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    c[d] = idx % shape[d];
    idx /= shape[d];
  }
  std::string s = "[";
  for (std::size_t d = 0; d < c.size(); ++d) s += (d ? ", " : "") + std::to_string(c[d]);
  return s + "]";
}

/// Compares one gradient with its oracle, prints its line and checks it: no NaN / Inf; relative RMS within `tol`, for a
/// bf16 gradient within max(tol, 1.5 x the tensor's own bf16 rounding floor) (tol::kda_bwd_bf16: a tensor of a few
/// elements can round worse than the floor of a large one, a single element by up to 2^-8 = 3.9e-3).
/// With `twin` (numerics/kda_backward_twin.hpp) its error is printed too, and a bf16 gradient's error must be within
/// tol::twin_vs_kernel (10%) of the twin's: the twin rounds the same fp32 values the kernel rounds.
void check_grad(const char* name, const std::vector<double>& out, const Tensor<double>& ref, double tol, bool bf16,
                const Tensor<double>* twin = nullptr) {
  const ErrorMetrics m = compare(out, ref.data, name);
  const double e_twin = twin ? compare(twin->data, ref.data).rel_rms : -1.0;
  double ref2 = 0;
  for (double x : ref.data) ref2 += x * x;
  const double rms_ref = std::sqrt(ref2 / std::max<std::size_t>(1, ref.data.size()));
  std::size_t imax = 0, ibad = out.size();
  double emax = -1;
  for (std::size_t i = 0; i < out.size(); ++i) {
    const double e = std::fabs(out[i] - ref.data[i]);
    if (!(e <= emax)) {  // NaN counts as the largest
      emax = e;
      imax = i;
      if (std::isnan(e)) emax = INFINITY;
    }
    if (ibad == out.size() && !(e <= 8 * tol * rms_ref)) ibad = i;
  }
  const double floor = bf16_rounding_floor(ref.data);
  const double bound = bf16 ? std::max(tol, 1.5 * floor) : tol;
  const std::string floor_s = bf16 ? ", bf16 floor " + std::to_string(floor) : "";
  std::printf("  %-7s rel_rms %.3e (twin %.3e, bound %.2e%s) max_abs %.3e at %s (out %.6g ref %.6g) rms_ref %.3e "
              "nan %lld inf %lld",
              name, m.rel_rms, e_twin, bound, floor_s.c_str(), emax, coords(imax, ref.shape).c_str(),
              out.empty() ? 0.0 : out[imax], ref.data.empty() ? 0.0 : ref.data[imax], rms_ref,
              static_cast<long long>(m.nan_count), static_cast<long long>(m.inf_count));
  if (ibad < out.size())
    std::printf("; first > 8 tol rms_ref at %s (out %.6g ref %.6g)", coords(ibad, ref.shape).c_str(), out[ibad],
                ref.data[ibad]);
  std::printf("\n");
  CAPTURE(name, m.rel_rms, bound, m.nan_count, m.inf_count);
  CHECK(m.nan_count + m.inf_count == 0);
  CHECK(m.rel_rms <= bound);
  if (twin && bf16) {
    CAPTURE(e_twin);
    CHECK(std::fabs(m.rel_rms - e_twin) <= tol::twin_vs_kernel.value * m.rel_rms);
  }
}

/// A state of the problem, or zeros of its shape [N, HV, D, D] where the problem has none (uploaded, not passed).
Tensor<double> state_or_zero(const Problem& p, const std::optional<Tensor<double>>& s) {
  return s ? *s : Tensor<double>({p.N, p.HV, p.D, p.D}, 0.0);
}

/// Device copies of a problem and the kernel's argument set pointing at them (outputs allocated here).
struct DevProblem {
  DevBuf q, k, v, g, beta, A_log, bias, S0, dO, dS_T, cu;
  DevBuf dq, dk, dv, dg, dbeta, dA_log, dbias, dS0;
  std::optional<DevBuf> ws, v_pad, dO_pad;
  kernels::KdaBackwardArgs a;
  kernels::KdaBackwardOverrides ov;
  DevProblem(const Problem& p, const BwdCase& c, kernels::KdaBackwardPass pass = kernels::KdaBackwardPass::automatic)
      : q(upload_bf16(p.q)), k(upload_bf16(p.k)), v(upload_bf16(p.v)), g(upload_bf16(p.g)), beta(upload_bf16(p.beta)),
        A_log(upload_f32(p.A_log)), bias(upload_f32(p.bias)), S0(upload_f32(state_or_zero(p, p.S0))),
        dO(upload_bf16(p.dO)), dS_T(upload_f32(state_or_zero(p, p.dS_T))),
        cu(std::max<std::size_t>(p.cu.size(), 1) * 4), dq(p.q.numel() * 2),
        dk(p.k.numel() * 2), dv(p.v.numel() * 2), dg(p.g.numel() * 2), dbeta(p.beta.numel() * 2), dA_log(p.HV * 4),
        dbias(p.HV * p.D * 4), dS0(p.N * p.HV * p.D * p.D * 4) {
    a.B = static_cast<int>(p.B); a.T = static_cast<int>(p.T); a.H = static_cast<int>(p.H);
    a.HV = static_cast<int>(p.HV); a.D = static_cast<int>(p.D);
    a.q = q.as<bf16_t>(); a.k = k.as<bf16_t>(); a.v = v.as<bf16_t>(); a.g = g.as<bf16_t>();
    a.beta = beta.as<bf16_t>();
    a.gate.A_log = A_log.as<float>(); a.gate.bias = bias.as<float>(); a.gate.g_min = static_cast<float>(p.g_min);
    a.gate.fused = c.fused;
    a.gate.allow_unsafe_range = !c.fused;  // g given in [-5, 0] by construction
    a.scale = static_cast<float>(p.scale);
    a.l2norm_qk = c.l2norm;
    a.beta_sigmoid = c.beta_sigmoid;
    a.S0 = c.S0 ? S0.as<float>() : nullptr;
    a.dO = dO.as<bf16_t>();
    a.dS_T = c.dS_T ? dS_T.as<float>() : nullptr;
    if (!p.cu.empty()) {
      std::vector<int> h(p.cu.begin(), p.cu.end());
      cuda_check(cudaMemcpy(cu.p, h.data(), h.size() * 4, cudaMemcpyHostToDevice), "cu_seqlens");
      a.cu_seqlens = cu.as<int>();
      a.num_seqs = static_cast<int>(p.N);
      int mx = 0;
      for (std::size_t i = 0; i + 1 < h.size(); ++i) mx = std::max(mx, h[i + 1] - h[i]);
      a.max_seqlen = std::max(mx, 1);
    }
    if (c.pad) {  // v and dO with token rows of HV D + pad elements, the padding NaN (read, it would show)
      const std::size_t row = p.HV * p.D, rows = p.v.numel() / row, pitch = row + c.pad;
      for (auto [src, dst, ptr, st] : {std::tuple{&p.v, &v_pad, &a.v, &a.sv}, {&p.dO, &dO_pad, &a.dO, &a.sdo}}) {
        std::vector<bf16_t> h(rows * pitch, bf16_t{0x7fc0});
        for (std::size_t r = 0; r < rows; ++r)
          for (std::size_t i = 0; i < row; ++i) h[r * pitch + i] = bf16_bits(round_bf16(src->data[r * row + i]));
        dst->emplace(h.size() * 2);
        cuda_check(cudaMemcpy((*dst)->p, h.data(), h.size() * 2, cudaMemcpyHostToDevice), "upload padded");
        *ptr = (*dst)->as<bf16_t>();
        *st = kernels::Strides{static_cast<std::int64_t>(a.T * pitch), static_cast<std::int64_t>(pitch),
                               static_cast<std::int64_t>(p.D)};
      }
    }
    a.dq = dq.as<bf16_t>(); a.dk = dk.as<bf16_t>(); a.dv = dv.as<bf16_t>(); a.dg = dg.as<bf16_t>();
    a.dbeta = dbeta.as<bf16_t>();
    a.dA_log = dA_log.as<float>(); a.dbias = dbias.as<float>(); a.dS0 = dS0.as<float>();
    ov.pass = pass;
    a.workspace_bytes = kernels::kda_backward_workspace_bytes(a, &ov);
    ws.emplace(a.workspace_bytes);
    a.workspace = ws->p;
  }
  /// Poisons every output and the workspace, runs the backward, waits.
  void run() {
    for (DevBuf* b : {&dq, &dk, &dv, &dg, &dbeta, &dA_log, &dbias, &dS0, &*ws}) b->poison();
    kernels::kda_backward(a, nullptr, &ov);
    cuda_check(cudaDeviceSynchronize(), "kda_backward");
  }
  /// The gradients in the order of Out below, downloaded as doubles.
  std::vector<std::vector<double>> outputs() const {
    return {download_bf16(dq), download_bf16(dk), download_bf16(dv), download_bf16(dg), download_bf16(dbeta),
            download_f32(dA_log), download_f32(dbias), download_f32(dS0)};
  }
  /// Index of each gradient in outputs(); the bf16 ones first.
  enum Out : std::size_t { out_dq, out_dk, out_dv, out_dg, out_dbeta, out_dA_log, out_dbias, out_dS0 };
  /// True for the gate parameters' gradients (dA_log, dbias), which the kernel writes only with the fused K3 gate.
  static bool gate_param(std::size_t i) { return i == out_dA_log || i == out_dbias; }
};

const char* pass_name(kernels::KdaBackwardPass pass) {
  switch (pass) {
    case kernels::KdaBackwardPass::sweep: return "sweep";
    case kernels::KdaBackwardPass::chunked: return "chunked";
    case kernels::KdaBackwardPass::chunked_wg: return "chunked_wg";
    default: return "automatic";
  }
}

/// The twin of the pass that runs: numerics/kda_backward_twin.hpp for the sweep, the chunked twin with the kernel's
/// plan for the chunked pass, with the wgmma chains' plan (kda_bwd_plan_kernel_wg: the chains' products as bf16
/// hi + lo) for chunked_wg.
Grads twin_of(const Problem& p, kernels::KdaBackwardPass pass) {
  if (pass == kernels::KdaBackwardPass::sweep) return kda_backward_twin(p);
  if (pass == kernels::KdaBackwardPass::chunked_wg) return kda_chunk_backward_twin(p, kda_bwd_plan_kernel_wg());
  return kda_chunk_backward_twin(p, kda_bwd_plan_kernel());
}

void check_bwd(const BwdCase& c, kernels::KdaBackwardPass force = kernels::KdaBackwardPass::automatic,
               bool long_memory = false) {
  const std::string name = c.name() + (long_memory ? " long-memory" : "");
  CAPTURE(name);
  Problem p = make_problem(c, fresh_seed());
  if (long_memory) make_long_memory(p);
  DevProblem d(p, c, force);
  const kernels::KdaBackwardPass pass = kernels::kda_backward_plan(d.a, &d.ov);
  std::printf("kda_backward %s pass=%s\n", name.c_str(), pass_name(pass));
  const Grads ref = oracle(p);
  d.run();
  const auto out = d.outputs();
  const double tb = tol::kda_bwd_bf16.value, tf = tol::kda_bwd_f32.value;
  const Grads tw = twin_of(p, pass);
  const auto T = [&](const Tensor<double> Grads::*m) { return &(tw.*m); };
  check_grad("dq", out[DevProblem::out_dq], ref.dq, tb, true, T(&Grads::dq));
  check_grad("dk", out[DevProblem::out_dk], ref.dk, tb, true, T(&Grads::dk));
  check_grad("dv", out[DevProblem::out_dv], ref.dv, tb, true, T(&Grads::dv));
  check_grad(c.fused ? "dg_raw" : "dg", out[DevProblem::out_dg], ref.dg, tb, true, T(&Grads::dg));
  check_grad(c.beta_sigmoid ? "dbeta_r" : "dbeta", out[DevProblem::out_dbeta], ref.dbeta, tb, true, T(&Grads::dbeta));
  check_grad("dS0", out[DevProblem::out_dS0], ref.dS0, tf, false, T(&Grads::dS0));
  if (c.fused) {
    check_grad("dA_log", out[DevProblem::out_dA_log], ref.dA_log, tf, false, T(&Grads::dA_log));
    check_grad("dbias", out[DevProblem::out_dbias], ref.dbias, tf, false, T(&Grads::dbias));
  }
  if (c.twice) {
    d.run();
    const auto again = d.outputs();
    for (std::size_t i = 0; i < out.size(); ++i) {
      if (!c.fused && DevProblem::gate_param(i)) continue;  // not written (poison both times)
      CAPTURE(i);
      CHECK(std::equal(out[i].begin(), out[i].end(), again[i].begin(),
                       [](double x, double y) { return x == y || (std::isnan(x) && std::isnan(y)); }));
    }
  }
}

/// T = 1, 17, 300 at D = 64, 128, 256 (HV = 2H from T = 17 on, B = 2 at T = 17, dS_T at T = 17), the fused pre-ops.
std::vector<BwdCase> shape_cases() {
  std::vector<BwdCase> v;
  for (const std::size_t D : {std::size_t{64}, std::size_t{128}, std::size_t{256}}) {
    v.push_back(shape(1, 1, 1, 1, D));
    BwdCase c = shape(2, 17, 1, 2, D);
    c.dS_T = true;
    c.twice = true;
    v.push_back(c);
    v.push_back(shape(1, 300, 1, 2, D));
  }
  BwdCase c = shape(3, 64, 2, 1, 128);  // T a multiple of the checkpoint interval, no S0, H = 2
  c.S0 = false;
  v.push_back(c);
  return v;
}

/// The pre-op switches: the gate given as the log-decay, q and k given normalised, beta given.
std::vector<BwdCase> switch_cases() {
  std::vector<BwdCase> v;
  BwdCase c = shape(1, 300, 1, 2, 128);
  c.fused = false;
  c.l2norm = false;
  c.beta_sigmoid = false;
  c.dS_T = true;
  v.push_back(c);
  c = shape(2, 17, 1, 1, 64);
  c.fused = false;
  v.push_back(c);
  c = shape(1, 70, 1, 2, 256);
  c.l2norm = false;
  c.S0 = false;
  v.push_back(c);
  return v;
}

/// Packed sequences (cu_seqlens): a last sequence of 1 token, an empty one, S0 and dS_T per sequence.
std::vector<BwdCase> varlen_cases() {
  std::vector<BwdCase> v;
  for (const std::size_t D : {std::size_t{64}, std::size_t{128}, std::size_t{256}}) {
    BwdCase c = shape(1, 0, 1, 2, D);
    c.lens = {5, 64, 1};
    c.dS_T = true;
    v.push_back(c);
  }
  BwdCase c = shape(1, 0, 2, 1, 128);
  c.lens = {3, 0, 70, 1};
  c.dS_T = true;
  c.fused = false;
  v.push_back(c);
  return v;
}

}  // namespace

TEST_CASE("KDA backward shapes (D = 64, 128, 256; T = 1, 17, 300; HV = 2H) vs the float64 oracle", "[gpu][kda_bwd]") {
  for (const auto& c : shape_cases()) check_bwd(c);
}

TEST_CASE("KDA backward pre-op switches (gate given, no L2Norm, beta given) vs the float64 oracle", "[gpu][kda_bwd]") {
  for (const auto& c : switch_cases()) check_bwd(c);
}

TEST_CASE("KDA backward varlen (cu_seqlens; a 1-token last sequence, an empty one) vs the float64 oracle",
          "[gpu][kda_bwd]") {
  for (const auto& c : varlen_cases()) check_bwd(c);
}

TEST_CASE("KDA backward T = 2048 (32 checkpoints, dS_T, S0) vs the float64 oracle", "[gpu][kda_bwd]") {
  BwdCase c = shape(1, 2048, 1, 2, 128);
  c.dS_T = true;
  check_bwd(c);
}

TEST_CASE("KDA backward sweep pass (forced at D = 64, 128) vs the float64 oracle", "[gpu][kda_bwd]") {
  for (const auto& c : shape_cases())
    if (c.D != 256) check_bwd(c, kernels::KdaBackwardPass::sweep);
  for (const auto& c : varlen_cases())
    if (c.D != 256) check_bwd(c, kernels::KdaBackwardPass::sweep);
}

TEST_CASE("KDA backward chunked pass (forced at D = 64, 128) vs the float64 oracle", "[gpu][kda_bwd]") {
  for (const auto& list : {shape_cases(), switch_cases(), varlen_cases()})
    for (const auto& c : list)
      if (c.D != 256) check_bwd(c, kernels::KdaBackwardPass::chunked);
  BwdCase c = shape(1, 2048, 1, 2, 128);
  c.dS_T = true;
  check_bwd(c, kernels::KdaBackwardPass::chunked);
}

TEST_CASE("KDA backward strided v and dO (padded token rows) vs the float64 oracle, both passes", "[gpu][kda_bwd]") {
  for (const std::size_t D : {std::size_t{64}, std::size_t{128}}) {
    BwdCase c = shape(2, 70, 1, 2, D);
    c.pad = 8;
    c.dS_T = true;
    check_bwd(c, kernels::KdaBackwardPass::chunked);
    check_bwd(c, kernels::KdaBackwardPass::sweep);
    c = shape(1, 0, 1, 2, D);
    c.lens = {5, 40, 1};
    c.pad = 24;
    check_bwd(c, kernels::KdaBackwardPass::chunked);
  }
}

TEST_CASE("KDA backward chunked pass on long-memory inputs (slow decay, small beta; T = 1024, 4096)",
          "[gpu][kda_bwd]") {
  for (const std::size_t T : {std::size_t{1024}, std::size_t{4096}}) {
    BwdCase c = shape(1, T, 1, 1, 128);
    c.dS_T = true;
    check_bwd(c, kernels::KdaBackwardPass::chunked, true);
  }
}

namespace {
/// The D = 128 cases of the chunked pass's tests (shapes, pre-op switches, varlen, T = 2048 with dS_T): the cases the
/// chunked_wg pass runs.
std::vector<BwdCase> d128_cases() {
  std::vector<BwdCase> v;
  for (const auto& list : {shape_cases(), switch_cases(), varlen_cases()})
    for (const auto& c : list)
      if (c.D == 128) v.push_back(c);
  BwdCase c = shape(1, 2048, 1, 2, 128);
  c.dS_T = true;
  v.push_back(c);
  return v;
}

/// The chunked pass and chunked_wg on one problem: every output of chunked_wg against the chunked pass's, a bf16
/// gradient within tol::kda_bwd_chains_wg_vs_mma relative RMS, an fp32 one (dA_log, dbias, dS0) within
/// tol::kda_bwd_f32 (what each pass meets against the float64 oracle); no NaN / Inf. Prints one line per output.
void compare_chains(const BwdCase& c, bool long_memory = false) {
  const std::string name = c.name() + (long_memory ? " long-memory" : "");
  CAPTURE(name);
  Problem p = make_problem(c, fresh_seed());
  if (long_memory) make_long_memory(p);
  DevProblem mma(p, c, kernels::KdaBackwardPass::chunked), wg(p, c, kernels::KdaBackwardPass::chunked_wg);
  mma.run();
  wg.run();
  const auto a = mma.outputs(), b = wg.outputs();
  const char* const names[] = {"dq", "dk", "dv", "dg", "dbeta", "dA_log", "dbias", "dS0"};
  std::printf("kda_backward %s: chunked_wg vs chunked\n", name.c_str());
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!c.fused && DevProblem::gate_param(i)) continue;  // not written (poison in both)
    const ErrorMetrics m = compare(b[i], a[i], names[i]);
    const double bound = i <= DevProblem::out_dbeta ? tol::kda_bwd_chains_wg_vs_mma.value : tol::kda_bwd_f32.value;
    std::printf("  %-7s rel_rms %.3e (bound %.1e) max_abs %.3e nan %lld inf %lld\n", names[i], m.rel_rms, bound,
                m.max_abs, static_cast<long long>(m.nan_count), static_cast<long long>(m.inf_count));
    CAPTURE(names[i], m.rel_rms, bound, m.nan_count, m.inf_count);
    CHECK(m.nan_count + m.inf_count == 0);
    CHECK(m.rel_rms <= bound);
  }
}
}  // namespace

// The chunked pass with its chains on wgmma (KdaBackwardPass::chunked_wg, D = 128): the chunked pass's D = 128 cases
// against the float64 oracle with the same bounds, and the twin check against kda_bwd_plan_kernel_wg (the chains'
// products as bf16 hi + lo; the gradients stay at their bf16 floor, so the 10% twin check holds as for the chunked
// pass); then every output against the chunked pass's on the same inputs. Tag [chunked_wg] runs them alone.
TEST_CASE("KDA backward chunked_wg pass (wgmma chains, D = 128) vs the float64 oracle", "[gpu][kda_bwd][chunked_wg]") {
  for (const auto& c : d128_cases()) check_bwd(c, kernels::KdaBackwardPass::chunked_wg);
  BwdCase c = shape(2, 70, 1, 2, 128);  // strided v and dO (padded token rows, NaN-filled), fixed length and varlen
  c.pad = 8;
  c.dS_T = true;
  check_bwd(c, kernels::KdaBackwardPass::chunked_wg);
  c = shape(1, 0, 1, 2, 128);
  c.lens = {5, 40, 1};
  c.pad = 24;
  check_bwd(c, kernels::KdaBackwardPass::chunked_wg);
}

TEST_CASE("KDA backward chunked_wg pass on long-memory inputs (slow decay, small beta; T = 1024, 4096)",
          "[gpu][kda_bwd][chunked_wg]") {
  for (const std::size_t T : {std::size_t{1024}, std::size_t{4096}}) {
    BwdCase c = shape(1, T, 1, 1, 128);
    c.dS_T = true;
    check_bwd(c, kernels::KdaBackwardPass::chunked_wg, true);
  }
}

TEST_CASE("KDA backward chunked_wg pass vs the chunked pass on the same inputs", "[gpu][kda_bwd][chunked_wg]") {
  for (const auto& c : d128_cases()) compare_chains(c);
  BwdCase c = shape(1, 4096, 1, 1, 128);
  c.dS_T = true;
  compare_chains(c, true);
  c = shape(2, 300, 2, 2, 128);  // several value heads and both column blocks of each, two sequences
  c.dS_T = true;
  compare_chains(c);
}

TEST_CASE("KDA backward plan: chunked_wg runs at D = 128 only, the rule's pick there", "[gpu][kda_bwd][chunked_wg]") {
  for (const int D : {64, 128, 256}) {
    kernels::KdaBackwardArgs a;
    a.B = 1; a.T = 40; a.H = 1; a.HV = 1; a.D = D; a.scale = 0.1f;
    CAPTURE(D);
    CHECK((kernels::kda_backward_plan(a) == kernels::KdaBackwardPass::chunked_wg) == (D == 128));
    kernels::KdaBackwardOverrides ov;
    ov.pass = kernels::KdaBackwardPass::chunked_wg;
    if (D != 128) {
      std::string msg;
      try {
        kernels::kda_backward_plan(a, &ov);
      } catch (const std::exception& e) {
        msg = e.what();
      }
      CHECK(msg.find("pass = chunked_wg with D = " + std::to_string(D) + " and 1 sequences; accepted") !=
            std::string::npos);
    } else {
      CHECK(kernels::kda_backward_plan(a, &ov) == kernels::KdaBackwardPass::chunked_wg);
      kernels::KdaBackwardOverrides chunked;  // the same workspace as the chunked pass
      chunked.pass = kernels::KdaBackwardPass::chunked;
      CHECK(kernels::kda_backward_workspace_bytes(a, &ov) == kernels::kda_backward_workspace_bytes(a, &chunked));
    }
  }
}

TEST_CASE("KDA backward plan: chunked_wg for D = 128, chunked for D = 64, sweep for D = 256; chunked refused at "
          "D = 256",
          "[gpu][kda_bwd]") {
  for (const int D : {64, 128, 256}) {
    kernels::KdaBackwardArgs a;
    a.B = 1; a.T = 40; a.H = 1; a.HV = 1; a.D = D; a.scale = 0.1f;
    CAPTURE(D);
    CHECK(kernels::kda_backward_plan(a) ==
          (D == 256   ? kernels::KdaBackwardPass::sweep
           : D == 128 ? kernels::KdaBackwardPass::chunked_wg
                      : kernels::KdaBackwardPass::chunked));
    kernels::KdaBackwardOverrides ov;
    ov.pass = kernels::KdaBackwardPass::chunked;
    if (D == 256) {
      std::string msg;
      try {
        kernels::kda_backward_plan(a, &ov);
      } catch (const std::exception& e) {
        msg = e.what();
      }
      CHECK(msg.find("pass = chunked with D = 256 and 1 sequences; accepted") != std::string::npos);
    } else {
      CHECK(kernels::kda_backward_plan(a, &ov) == kernels::KdaBackwardPass::chunked);
    }
  }
}

namespace {
/// The message of the kdalab::Error `f` throws ("" when it does not throw).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("KDA backward fp32 gradient outputs are the bf16 outputs before their one rounding", "[gpu][kda_bwd]") {
  // KdaBackwardArgs::dq_f32 ...: what kdalab.torch.chunk_kda's value blocks sum before rounding once. The kernel is
  // deterministic, so rounding its fp32 gradients to bf16 must give the bf16 outputs bit for bit.
  for (BwdCase c : {shape(2, 37, 1, 2, 128), shape(1, 70, 2, 1, 64)}) {
    c.fused = c.D == 128;
    c.l2norm = c.beta_sigmoid = c.fused;
    const Problem p = make_problem(c, fresh_seed());
    DevProblem d(p, c);
    d.run();
    const auto bf = d.outputs();
    DevBuf q32(p.q.numel() * 4), k32(p.k.numel() * 4), g32(p.g.numel() * 4), b32(p.beta.numel() * 4);
    for (DevBuf* b : {&q32, &k32, &g32, &b32}) b->poison();
    auto a = d.a;
    a.dq = a.dk = a.dg = a.dbeta = nullptr;
    a.dq_f32 = q32.as<float>(); a.dk_f32 = k32.as<float>(); a.dg_f32 = g32.as<float>(); a.dbeta_f32 = b32.as<float>();
    kernels::kda_backward(a, nullptr);
    cuda_check(cudaDeviceSynchronize(), "kda_backward fp32 outputs");
    const DevBuf* f32[] = {&q32, &k32, &g32, &b32};
    const std::size_t bf_index[] = {DevProblem::out_dq, DevProblem::out_dk, DevProblem::out_dg, DevProblem::out_dbeta};
    for (int i = 0; i < 4; ++i) {
      const auto x = download_f32(*f32[i]);
      std::size_t differ = 0, nonfinite = 0;
      for (std::size_t e = 0; e < x.size(); ++e) {
        nonfinite += !std::isfinite(x[e]);
        differ += round_bf16(x[e]) != bf[bf_index[i]][e];
      }
      CAPTURE(c.name(), i, differ, nonfinite);
      CHECK(nonfinite == 0);
      CHECK(differ == 0);
    }
  }
}

TEST_CASE("KDA backward chunked passes with HV = H: the gradient kernel's own chain rules give the epilogue's bits",
          "[gpu][kda_bwd]") {
  // With one value head a key head the chunked passes' gradient kernel applies the chain rules (L2Norm, K3 gate, beta
  // sigmoid) to its own rows instead of writing partials for the epilogue kernel; KdaBackwardOverrides::
  // separate_epilogue keeps the epilogue kernel. Both run the same device functions on the same fp32 values in the
  // same order, so every output must agree bit for bit, and the workspace without the dq, dk, dbeta partials is smaller.
  using P = kernels::KdaBackwardPass;
  std::vector<std::pair<BwdCase, P>> cases;
  BwdCase c = shape(2, 300, 2, 1, 128);
  c.dS_T = true;
  cases.emplace_back(c, P::chunked_wg);
  c = shape(1, 70, 1, 1, 64);  // the pre-ops off: g given, q and k given normalised, beta given
  c.fused = c.l2norm = c.beta_sigmoid = false;
  cases.emplace_back(c, P::chunked);
  c = shape(1, 0, 2, 1, 128);  // packed sequences, a 1-token and an empty one among them
  c.lens = {37, 1, 0, 130};
  cases.emplace_back(c, P::chunked_wg);
  cases.emplace_back(shape(1, 33, 1, 1, 128), P::chunked);
  for (const auto& [bc, pass] : cases) {
    CAPTURE(bc.name(), pass_name(pass));
    const Problem p = make_problem(bc, fresh_seed());
    DevProblem tail(p, bc, pass), sep(p, bc, pass);
    sep.ov.separate_epilogue = true;
    sep.a.workspace_bytes = kernels::kda_backward_workspace_bytes(sep.a, &sep.ov);
    sep.ws.emplace(sep.a.workspace_bytes);
    sep.a.workspace = sep.ws->p;
    CHECK(tail.a.workspace_bytes < sep.a.workspace_bytes);
    tail.run();
    sep.run();
    const auto a = tail.outputs(), b = sep.outputs();
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (!bc.fused && DevProblem::gate_param(i)) continue;  // not written (poison in both)
      std::size_t differ = 0, nonfinite = 0;
      for (std::size_t e = 0; e < a[i].size(); ++e) {
        nonfinite += !std::isfinite(a[i][e]);
        differ += !(a[i][e] == b[i][e]);
      }
      CAPTURE(i, differ, nonfinite);
      CHECK(nonfinite == 0);
      CHECK(differ == 0);
    }
  }
}

TEST_CASE("KDA backward bad arguments throw before any launch, naming the argument", "[gpu][kda_bwd]") {
  BwdCase c = shape(1, 20, 1, 2, 128);
  const Problem p = make_problem(c, fresh_seed());
  DevProblem d(p, c);
  REQUIRE_NOTHROW(d.run());
  const auto throws_naming = [&](kernels::KdaBackwardArgs bad, const std::string& what) {
    const std::string msg = error_of([&] { kernels::kda_backward(bad, nullptr); });
    CAPTURE(what, msg);
    CHECK(msg.find(what) != std::string::npos);
  };
  // one row per bad argument: the change to the good arguments and the name the message must carry
  DevBuf f32(c.B * c.T * c.H * c.group * c.D * 4);
  float* const pf = f32.as<float>();
  const struct {
    const char* names;
    std::function<void(kernels::KdaBackwardArgs&)> change;
  } rows[] = {
      {"D = 96", [](auto& a) { a.D = 96; }},
      {"T = 0", [](auto& a) { a.T = 0; }},
      {"HV = 3", [](auto& a) { a.H = 2; a.HV = 3; }},
      {"'dO'", [](auto& a) { a.dO = nullptr; }},
      {"'dq'", [](auto& a) { a.dq = nullptr; }},
      {"'dk'", [](auto& a) { a.dk = a.dk + 1; }},  // 2-byte offset: not 16-byte aligned
      {"'dA_log'", [](auto& a) { a.dA_log = nullptr; }},  // required with the fused gate
      {"g_min", [](auto& a) { a.gate.g_min = -6.0f; }},
      {"gate.fused", [](auto& a) { a.gate.fused = false; a.gate.allow_unsafe_range = false; }},
      {"scale", [](auto& a) { a.scale = 0.0f; }},
      {"workspace_bytes", [](auto& a) { a.workspace_bytes = 100; }},
      {"'v.t'", [](auto& a) { a.sv.t = 7; }},  // named as t, not as the b stride derived from it
      {"'g.h'", [](auto& a) { a.sg.h = 12; }},  // named as h, not as the t stride derived from it
      {"cu_seqlens", [&](auto& a) { a.cu_seqlens = d.cu.as<int>(); a.B = 2; }},
      // the fp32 gradient outputs: all four instead of the bf16 ones, never both, never some
      {"both given", [&](auto& a) { a.dq_f32 = a.dk_f32 = a.dg_f32 = a.dbeta_f32 = pf; }},
      {"'dk_f32'", [&](auto& a) { a.dq = a.dk = a.dg = nullptr; a.dbeta = nullptr; a.dq_f32 = pf; }},
  };
  for (const auto& r : rows) {
    auto bad = d.a;
    r.change(bad);
    throws_naming(bad, r.names);
  }
  cuda_check(cudaDeviceSynchronize(), "after bad arguments");
}
