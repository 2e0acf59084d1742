#pragma once
/// Shared plumbing of the recall and copy experiments (experiments/recall.cpp, copy_exp.cpp):
/// the memories under test and how one write/read sequence is pushed through each of them.
/// The math is the references' (reference/kda.hpp, softmax.hpp, latent_memory.hpp); this file only
/// lays tokens out and collects the reads.
#include <cmath>
#include <string>
#include <vector>

#include "numerics/bf16.hpp"
#include "numerics/random.hpp"
#include "reference/error.hpp"
#include "reference/kda.hpp"
#include "reference/latent_memory.hpp"
#include "reference/softmax.hpp"

namespace kdalab::exp {

/// The memories of docs/equations.md (KDA recurrence, Gated MLA, associative-memory facts).
enum class Memory { softmax, mla, linear, gla, deltanet, gated_deltanet, kda };

inline const std::vector<std::string>& memory_names() {
  static const std::vector<std::string> n{"softmax", "mla", "linear", "gla", "deltanet", "gated_deltanet", "kda"};
  return n;
}
inline Memory parse_memory(const std::string& s, const std::string& option) {
  const auto& n = memory_names();
  for (std::size_t i = 0; i < n.size(); ++i)
    if (n[i] == s) return static_cast<Memory>(i);
  throw Error(option + ": memory '" + s +
              "' is unknown; accepted: softmax, mla, linear, gla, deltanet, gated_deltanet, kda");
}
inline std::string memory_name(Memory m) { return memory_names()[static_cast<std::size_t>(m)]; }
inline bool uses_beta(Memory m) { return m == Memory::deltanet || m == Memory::gated_deltanet || m == Memory::kda; }
inline bool uses_decay(Memory m) { return m == Memory::gla || m == Memory::gated_deltanet || m == Memory::kda; }
inline bool is_recurrent(Memory m) { return m != Memory::softmax && m != Memory::mla; }
inline KdaVariant variant_of(Memory m) {
  switch (m) {
    case Memory::linear: return KdaVariant::linear;
    case Memory::gla: return KdaVariant::gla;
    case Memory::deltanet: return KdaVariant::deltanet;
    case Memory::gated_deltanet: return KdaVariant::gated_deltanet;
    default: return KdaVariant::kda;
  }
}

/// One token sequence for a memory: at position t a write (k_t, v_t, with beta) or nothing
/// (k = v = 0), and optionally a read with q_t. The log-decay g_t (d_k) is applied at every step.
struct Sequence {
  Mat<double> k, v, q, g;       ///< L x d_k, L x d_v, L x d_k, L x d_k
  std::vector<bool> write, read;  ///< L flags
};

/// Precision a recurrent memory runs in: fp64 and fp32 run the reference in double / float;
/// bf16 runs it in float with inputs and the state rounded to bf16 after every step (state
/// stored in bf16, arithmetic in fp32).
enum class Precision { fp64, fp32, bf16 };
inline Precision parse_precision(const std::string& s, const std::string& option) {
  if (s == "fp64") return Precision::fp64;
  if (s == "fp32") return Precision::fp32;
  if (s == "bf16") return Precision::bf16;
  throw Error(option + ": precision '" + s + "' is unknown; accepted: fp64, fp32, bf16");
}
inline int precision_bits(Precision p) { return p == Precision::fp64 ? 64 : p == Precision::fp32 ? 32 : 16; }

/// Runs the sequence through memory m and returns the reads (one row per read position, in order).
/// beta: write strength of delta memories; out_scale: o = out_scale * S^T q for recurrent memories;
/// softmax_scale: inverse temperature of softmax/MLA; codec: for MLA (nullptr otherwise).
inline Mat<double> run_memory(Memory m, const Sequence& s, double beta, double out_scale, double softmax_scale,
                              const LatentCodec<double>* codec, Precision prec = Precision::fp64) {
  const Eigen::Index L = s.k.rows(), d_k = s.k.cols(), d_v = s.v.cols();
  Eigen::Index n_reads = 0;
  for (bool r : s.read) n_reads += r ? 1 : 0;
  Mat<double> out(n_reads, d_v);
  Eigen::Index r = 0;
  if (m == Memory::softmax || m == Memory::mla) {
    if (m == Memory::mla && codec == nullptr) throw Error("run_memory: the MLA memory needs a latent codec");
    SoftmaxCache<double> cache(d_k, d_v, m == Memory::softmax ? L : 0);
    // MLA through reference/mla.hpp: one head, x = [k; v] for a write, [q; 0] for a read.
    MlaConfig cfg;
    MlaWeights<double> w;
    if (codec) {
      cfg = codec->mla_config();
      w = codec->mla_weights(softmax_scale);
    }
    Mat<double> C(m == Memory::mla ? L : 0, codec ? codec->d_c : 0);  // the latent cache
    Eigen::Index n = 0;
    Mat<double> x(1, d_k + d_v);
    for (Eigen::Index t = 0; t < L; ++t) {
      if (s.write[t]) {
        if (m == Memory::softmax) cache.append(s.k.row(t).transpose(), s.v.row(t).transpose());
        else if (codec) {
          x << s.k.row(t), s.v.row(t);
          C.row(n) = mla_project<double>(cfg, w, x, static_cast<std::size_t>(n)).c.row(0);
          ++n;
        }
      }
      if (s.read[t]) {
        if (m == Memory::softmax) out.row(r++) = cache.read(s.q.row(t).transpose(), softmax_scale).transpose();
        else if (codec) {
          x << s.q.row(t), Mat<double>::Zero(1, d_v);
          const auto p = mla_project<double>(cfg, w, x, static_cast<std::size_t>(n));
          out.row(r++) = mla_attend_absorbed<double>(cfg, w, p, Mat<double>(C.topRows(n)), Mat<double>(n, 0),
                                                     static_cast<std::size_t>(n - 1)).row(0);
        }
      }
    }
    return out;
  }
  const KdaVariant var = variant_of(m);
  if (prec == Precision::fp64) {
    Mat<double> S = Mat<double>::Zero(d_k, d_v);
    for (Eigen::Index t = 0; t < L; ++t) {
      const Vec<double> o = kda_step<double>(S, s.q.row(t).transpose(), s.k.row(t).transpose(), s.v.row(t).transpose(),
                                             s.g.row(t).transpose(), s.write[t] ? beta : 0.0, out_scale, var);
      if (s.read[t]) out.row(r++) = o.transpose();
    }
    return out;
  }
  auto rnd = [&](double x) { return prec == Precision::bf16 ? round_to(x, Format::bf16) : x; };
  Mat<float> S = Mat<float>::Zero(d_k, d_v);
  Vec<float> q(d_k), k(d_k), g(d_k), v(d_v);
  for (Eigen::Index t = 0; t < L; ++t) {
    for (Eigen::Index i = 0; i < d_k; ++i) {
      q(i) = static_cast<float>(rnd(s.q(t, i)));
      k(i) = static_cast<float>(rnd(s.k(t, i)));
      g(i) = static_cast<float>(s.g(t, i));  // gates stay fp32 (as the kernels keep them)
    }
    for (Eigen::Index j = 0; j < d_v; ++j) v(j) = static_cast<float>(rnd(s.v(t, j)));
    const Vec<float> o = kda_step<float>(S, q, k, v, g, static_cast<float>(s.write[t] ? beta : 0.0),
                                         static_cast<float>(out_scale), var);
    if (prec == Precision::bf16)
      for (Eigen::Index i = 0; i < S.size(); ++i) S.data()[i] = static_cast<float>(round_to(S.data()[i], Format::bf16));
    if (s.read[t]) out.row(r++) = o.cast<double>().transpose();
  }
  return out;
}

/// n random unit vectors of width d (rows), from N(0, I) normalised.
inline Mat<double> random_unit_rows(Rng& rng, Eigen::Index n, Eigen::Index d) {
  Mat<double> x(n, d);
  for (Eigen::Index i = 0; i < n; ++i) {
    for (Eigen::Index j = 0; j < d; ++j) x(i, j) = rng.normal();
    x.row(i).normalize();
  }
  return x;
}

/// n unit rows of width d, orthonormal in blocks of d: rows [b d, (b+1) d) are one random
/// orthonormal basis (Householder QR of a Gaussian matrix); n <= d gives an orthonormal set.
inline Mat<double> orthogonal_rows(Rng& rng, Eigen::Index n, Eigen::Index d) {
  Mat<double> x(n, d);
  for (Eigen::Index b = 0; b < n; b += d) {
    Mat<double> G(d, d);
    for (Eigen::Index i = 0; i < d; ++i)
      for (Eigen::Index j = 0; j < d; ++j) G(i, j) = rng.normal();
    Eigen::HouseholderQR<Mat<double>> qr(G);
    const Mat<double> Q = qr.householderQ();
    for (Eigen::Index i = b; i < std::min(n, b + d); ++i) x.row(i) = Q.col(i - b).transpose();
  }
  return x;
}

/// n unit rows whose pairwise cosine is about rho: normalise(sqrt(rho) c + sqrt(1 - rho) u_i) with
/// one shared random unit c and random unit u_i.
inline Mat<double> correlated_rows(Rng& rng, Eigen::Index n, Eigen::Index d, double rho) {
  const Mat<double> c = random_unit_rows(rng, 1, d);
  Mat<double> u = random_unit_rows(rng, n, d);
  for (Eigen::Index i = 0; i < n; ++i) {
    u.row(i) = std::sqrt(rho) * c.row(0) + std::sqrt(1.0 - rho) * u.row(i);
    u.row(i).normalize();
  }
  return u;
}

/// Nearest row of E (unit rows) to each row of O by inner product: returns the row indices.
inline std::vector<Eigen::Index> nearest_rows(const Mat<double>& O, const Mat<double>& E) {
  const Mat<double> sc = O * E.transpose();
  std::vector<Eigen::Index> idx(static_cast<std::size_t>(O.rows()));
  for (Eigen::Index i = 0; i < O.rows(); ++i) sc.row(i).maxCoeff(&idx[static_cast<std::size_t>(i)]);
  return idx;
}

}  // namespace kdalab::exp
