#pragma once
/// KDA decode steps (the golden decode fixture, `kdalab check --op kda-decode`, the Python oracle).
///
/// kda_decode_steps: the one-token decode path, T kda_step calls per (b, h) from an initial state,
/// token-major (every sequence advances one token at a time, as a serving loop does). Must equal
/// kda_recurrent (K3 report Eq. 1) to rounding; it is a separate code path on purpose, so a
/// golden decode fixture catches a change of kda_step that the batched loop would hide.
/// Shapes: q, k [B, T, H, d_k]; v [B, T, HV, d_v]; g [B, T, HV, d_k]; beta [B, T, HV];
/// S0 [B, HV, d_k, d_v] (KV layout). Returns o [B, T, HV, d_v] and the state after T steps.
/// Errors: kdalab::Error from kda_validate().
#include "reference/kda.hpp"

namespace kdalab {

template <class S>
KdaOutput<S> kda_decode_steps(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v, const Tensor<S>& g,
                              const Tensor<S>& beta, const Tensor<S>& S0, const S& scale) {
  const KdaShape s = kda_validate(q, k, v, g, beta, &S0);
  KdaOutput<S> out{Tensor<S>({s.B, s.T, s.HV, s.d_v}), S0};
  const std::size_t group = s.HV / s.H;
  for (std::size_t t = 0; t < s.T; ++t)
    for (std::size_t b = 0; b < s.B; ++b)
      for (std::size_t h = 0; h < s.HV; ++h) {
        Mat<S> St(s.d_k, s.d_v);
        for (std::size_t i = 0; i < s.d_k; ++i)
          for (std::size_t j = 0; j < s.d_v; ++j) St(i, j) = out.S_final(b, h, i, j);
        Vec<S> qt(s.d_k), kt(s.d_k), gt(s.d_k), vt(s.d_v);
        for (std::size_t i = 0; i < s.d_k; ++i) {
          qt(i) = q(b, t, h / group, i);
          kt(i) = k(b, t, h / group, i);
          gt(i) = g(b, t, h, i);
        }
        for (std::size_t j = 0; j < s.d_v; ++j) vt(j) = v(b, t, h, j);
        const Vec<S> ot = kda_step<S>(St, qt, kt, vt, gt, beta(b, t, h), scale);
        for (std::size_t j = 0; j < s.d_v; ++j) out.o(b, t, h, j) = ot(j);
        for (std::size_t i = 0; i < s.d_k; ++i)
          for (std::size_t j = 0; j < s.d_v; ++j) out.S_final(b, h, i, j) = St(i, j);
      }
  return out;
}

// Explicit instantiations: compiled once, in reference/instantiate/ (the library kdalab_reference), for the
// scalars below; every other file links them instead of compiling them again. X is `extern` or empty.
#define KDALAB_TEMPLATES_KDA_DECODE(X, S) \
  X template KdaOutput<S> kda_decode_steps<S>(const Tensor<S>&, const Tensor<S>&, const Tensor<S>&, const Tensor<S>&, \
      const Tensor<S>&, const Tensor<S>&, const S&);
KDALAB_TEMPLATES_KDA_DECODE(extern, double)
KDALAB_TEMPLATES_KDA_DECODE(extern, mp50)
KDALAB_TEMPLATES_KDA_DECODE(extern, float)

}  // namespace kdalab
