#pragma once
/// The verdict budget of `kdalab check` (docs/check-format.md, "The budget rule"): how far a candidate at a declared
/// precision p may be from the truth before the check calls it a bug, fixed from the inputs alone.
///
///   budget(x) = max(F (relRMS(emulation_p(x), truth(x)) + relRMS(round_fmt(truth(x)), truth(x))), floor)
///
/// emulation_p: numerics/plain_emulation.hpp, the plain algorithm at precision p on the same inputs (the error an
/// honest implementation at p makes); round_fmt: the truth rounded once to the candidate's storage format (the
/// error of storing a perfect result); F = tol::budget_factor, floor = tol::budget_floor (their reasons are in
/// numerics/tolerance.hpp). The budget depends only on the inputs, p and the output format, never on the candidate.
///
/// Verdicts (ratio = relRMS(candidate, truth) / budget):
///   "within the noise of its precision"  ratio <= 1 and no NaN / Inf
///   "over budget by x<ratio>"            ratio > 1
///   "bug: N NaN" / "bug: N Inf" / "bug: N NaN, M Inf"   any non-finite value in the candidate
#include <string>
#include <vector>

#include <fmt/format.h>

#include "numerics/bf16.hpp"
#include "numerics/metrics.hpp"
#include "numerics/tolerance.hpp"

namespace kdalab {

/// One budget and its two terms (relative RMS units).
struct Budget {
  double emulation = 0;        ///< relRMS(emulation_p, truth)
  double output_rounding = 0;  ///< relRMS(round_fmt(truth), truth)
  double value = 0;            ///< max(F (emulation + output_rounding), floor)
};

/// The budget of one tensor: emulation and truth are flat and of equal length, fmt is the candidate's storage
/// format. Errors: kdalab::Error from compare() (length mismatch, non-finite truth).
inline Budget budget_of(const std::vector<double>& emulation, const std::vector<double>& truth, Format fmt) {
  Budget b;
  b.emulation = compare(emulation, truth, "emulation").rel_rms;  // a non-finite emulation gives +Inf: no verdict
  std::vector<double> stored(truth.size());
  for (std::size_t i = 0; i < truth.size(); ++i) stored[i] = round_to(truth[i], fmt);
  b.output_rounding = compare(stored, truth, "stored truth").rel_rms;
  b.value = std::max(tol::budget_factor.value * (b.emulation + b.output_rounding), tol::budget_floor.value);
  return b;
}

/// Whether a candidate with metrics m passes a threshold (a budget or an explicit --tol).
inline bool within(const ErrorMetrics& m, double threshold) {
  return m.nan_count == 0 && m.inf_count == 0 && m.rel_rms <= threshold;
}

/// The verdict text of a candidate against a threshold (file comment).
inline std::string verdict_text(const ErrorMetrics& m, double threshold) {
  if (m.nan_count || m.inf_count) {
    std::string s = "bug:";
    if (m.nan_count) s += fmt::format(" {} NaN", m.nan_count);
    if (m.inf_count) s += fmt::format("{} {} Inf", m.nan_count ? "," : "", m.inf_count);
    return s;
  }
  if (m.rel_rms <= threshold) return "within the noise of its precision";
  return fmt::format("over budget by x{:.3g}", m.rel_rms / threshold);
}

}  // namespace kdalab
