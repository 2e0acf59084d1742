// The bf16 reference emulation of the KDA backward for `kdalab parity --backward` (experiments/parity_emul.hpp).
// Built against numerics/plain_emulation.hpp when the tree has it; without it the row is skipped with a note.
#include "experiments/parity_emul.hpp"

#if __has_include("numerics/plain_emulation.hpp")
#include "numerics/plain_emulation.hpp"
#define KDALAB_PARITY_HAVE_EMULATION 1
#endif

namespace kdalab::cli {

std::optional<std::string> bf16_emulation_unavailable() {
#ifdef KDALAB_PARITY_HAVE_EMULATION
  return std::nullopt;
#else
  return "bf16-emu rows skipped: the bf16 reference emulation of the backward (numerics/plain_emulation.hpp) is not in "
         "this build";
#endif
}

std::optional<std::vector<std::vector<double>>> kda_backward_bf16_emulation(
    const Tensor<double>& q, const Tensor<double>& k, const Tensor<double>& v, const Tensor<double>& g,
    const Tensor<double>& beta, const Tensor<double>& S0, double scale, const Tensor<double>& dO,
    const Tensor<double>& dS_T, std::string& why) {
#ifdef KDALAB_PARITY_HAVE_EMULATION
  const emul::Arith ar = emul::Arith::at(Format::bf16);
  const std::size_t B = q.dim(0), T = q.dim(1), H = q.dim(2), dk = q.dim(3), HV = v.dim(2), dv = v.dim(3);
  const auto Ti = static_cast<Eigen::Index>(T), dki = static_cast<Eigen::Index>(dk), dvi = static_cast<Eigen::Index>(dv);
  Tensor<double> dq(q.shape), dkk(k.shape), dvv(v.shape), dg(g.shape), db(beta.shape), dS0(S0.shape);
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t hv = 0; hv < HV; ++hv) {
      const std::size_t h = hv / (HV / H);
      Mat<double> qh(Ti, dki), kh(Ti, dki), gh(Ti, dki), vh(Ti, dvi), dOh(Ti, dvi), St(dki, dvi), dST(dki, dvi);
      Vec<double> bh(Ti);
      for (std::size_t t = 0; t < T; ++t) {
        const auto tt = static_cast<Eigen::Index>(t);
        for (std::size_t i = 0; i < dk; ++i) {
          const auto ii = static_cast<Eigen::Index>(i);
          qh(tt, ii) = ar.op(ar.r(q(b, t, h, i)));  // one bf16 copy of q and k (the emulation's KDA entry point)
          kh(tt, ii) = ar.op(ar.r(k(b, t, h, i)));
          gh(tt, ii) = ar.r(g(b, t, hv, i));
        }
        for (std::size_t j = 0; j < dv; ++j) {
          vh(tt, static_cast<Eigen::Index>(j)) = v(b, t, hv, j);
          dOh(tt, static_cast<Eigen::Index>(j)) = dO(b, t, hv, j);
        }
        bh(tt) = ar.r(beta(b, t, hv));
      }
      for (std::size_t i = 0; i < dk; ++i)
        for (std::size_t j = 0; j < dv; ++j) {
          St(static_cast<Eigen::Index>(i), static_cast<Eigen::Index>(j)) = S0(b, hv, i, j);
          dST(static_cast<Eigen::Index>(i), static_cast<Eigen::Index>(j)) = dS_T(b, hv, i, j);
        }
      KdaHeadGrad<double> gr;
      (void)emul::kda_head(ar, qh, kh, vh, gh, bh, St, scale, 64, &dOh, &dST, &gr);
      for (std::size_t t = 0; t < T; ++t) {
        const auto tt = static_cast<Eigen::Index>(t);
        for (std::size_t i = 0; i < dk; ++i) {
          const auto ii = static_cast<Eigen::Index>(i);
          dq(b, t, h, i) = ar.r(dq(b, t, h, i) + gr.dq(tt, ii));
          dkk(b, t, h, i) = ar.r(dkk(b, t, h, i) + gr.dk(tt, ii));
          dg(b, t, hv, i) = gr.dg(tt, ii);
        }
        for (std::size_t j = 0; j < dv; ++j) dvv(b, t, hv, j) = gr.dv(tt, static_cast<Eigen::Index>(j));
        db(b, t, hv) = gr.dbeta(tt);
      }
      for (std::size_t i = 0; i < dk; ++i)
        for (std::size_t j = 0; j < dv; ++j)
          dS0(b, hv, i, j) = gr.dS0(static_cast<Eigen::Index>(i), static_cast<Eigen::Index>(j));
    }
  (void)why;
  return std::vector<std::vector<double>>{dq.data, dkk.data, dvv.data, dg.data, db.data, dS0.data};
#else
  (void)q, (void)k, (void)v, (void)g, (void)beta, (void)S0, (void)scale, (void)dO, (void)dS_T;
  why = *bf16_emulation_unavailable();
  return std::nullopt;
#endif
}

}  // namespace kdalab::cli
