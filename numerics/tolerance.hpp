#pragma once
/// Tolerances as data: every threshold a test or a verdict uses lives here, keyed by operation and
/// precision, each with the reason for its value (docs/design.md, conventions).
///
/// Units: relative RMS (||out - ref|| / ||ref||) unless stated.
/// u_bf16 = 2^-8 (unit roundoff of bf16), u_fp32 = 2^-24, u_fp64 = 2^-53.
///
/// "anchor-kda" is the named KDA input generator (numerics/random.hpp): q, k, v, g_raw, beta_raw ~ N(0, 1)
/// rounded to bf16, K3 bounded gate with g_min = -5, q and k L2-normalised, S0 = 0.1 N(0, 1) in fp32,
/// D = 128. "The anchor cases" are (B, T, H) in {(1, 17, 1), (3, 64, 1), (1, 300, 2), (1, 1000, 4),
/// (1, 4096, 2)}; their truth is the float64 recurrence on exactly the rounded inputs. Peer numbers quoted
/// below (fla chunk_kda, FlashKDA) were measured on the same cases.

namespace kdalab::tol {

struct Tolerance {
  double value;
  const char* why;
};

// ---- reference math on the CPU: float64, cpp_bin_float_50 (mp50), float32 -----------------------

/// float64 recurrence / chunked / layer vs the cpp_bin_float_50 truth and float64 identities.
inline constexpr Tolerance f64_vs_mp{1e-12,
    "float64 paths do O(T d) dependent flops per output; observed <= ~1e-14, 1e-12 leaves 100x margin "
    "while catching any algorithmic error (those show up at >= 1e-6)."};
/// Identities computed twice in float64 (chunked == recurrent, decode == prefill, absorbed == naive).
inline constexpr Tolerance f64_identity{1e-12,
    "two exact reformulations differ only by rounding order: a few hundred u_fp64 = ~1e-14; 1e-12 fails on "
    "any real discrepancy."};
/// Whole-hybrid decode vs prefill in float64 (many layers stacked, each an identity above).
inline constexpr Tolerance f64_hybrid{1e-11,
    "errors of the per-layer identities (each within f64_identity, 1e-12) compound over the layers of the toy "
    "hybrid; 1e-11 allows that sum and still fails any real discrepancy (>= 1e-6)."};
/// Identities in cpp_bin_float_50.
inline constexpr Tolerance mp_identity{1e-40,
    "cpp_bin_float_50 has u ~ 1e-50; reformulations differ by rounding only, 1e-40 leaves 1e10 margin."};
/// float32 reference vs the truth on anchor-kda inputs.
inline constexpr Tolerance f32_vs_truth{1e-5,
    "float32 recurrence: O(T) accumulated roundings of u_fp32 = 6e-8 with a contracting state; observed "
    "~1e-6 for T <= 4096."};
/// Band of a low-precision matmul's relative error (numerics/lowp.hpp), in units of the operand format's unit
/// roundoff u: random N(0,1) operands give ~0.5-1 u; a result outside [u/8, band u] means the
/// operands were not rounded (too small) or were rounded twice / accumulated wrongly (too large).
inline constexpr Tolerance lowp_matmul_band{4.0,
    "operand rounding of two N(0,1) factors gives ~0.8 u per product; 4 u leaves 5x margin."};

// ---- golden fixtures (float64 and mp50) and `kdalab check` -------------------------------------

/// float64 code vs a golden multiprecision output stored as float64.
inline constexpr Tolerance golden_f64{1e-13,
    "the stored truth is the mp50 result rounded once to float64 (1.1e-16); the float64 path adds "
    "~1e-15 on the small golden problems; 1e-13 catches any change of numerics at 1e-12 or above."};
/// float64 toy hybrid (9 stacked KDA / MLA layers, AttnRes, SwiGLU) vs its golden mp50 output.
inline constexpr Tolerance golden_f64_hybrid{1e-12,
    "the stacked layers amplify float64 rounding: measured 3.4e-14 (prefill) and 2.0e-14 (decode) on toy.json at "
    "T = 70, so golden_f64's 1e-13 would leave 3x; 1e-12 still catches any change of numerics in a layer (a "
    "1e-3 change of one input gives >= 1e-7)."};
/// cpp_bin_float_50 code vs a golden output (only the float64 storage rounding separates them).
inline constexpr Tolerance golden_mp{1e-15,
    "the stored float64 value is the mp50 result rounded once: relative RMS <= u_fp64 = 1.1e-16."};
/// Default verdict tolerance of `kdalab check` for a bf16 candidate.
inline constexpr Tolerance check_default{5.0e-3,
    "the threshold fla's own tests use (RMS ratio 5e-3): a candidate worse than the peers' bar fails."};
/// Safety factor F of the `kdalab check` budget rule (numerics/budget.hpp): budget = F (emulation error at the
/// declared precision + storage rounding of the output).
inline constexpr Tolerance budget_factor{2.0,
    "the budget admits a candidate whose rounding noise is up to twice that of the plain algorithm at its declared "
    "precision (another reduction order, tiling or chunk size than the emulation's), and nothing more; fixed at 2 "
    "before any peer was run against the rule. Measured (anchor-kda, T = 300, H = HV = 2, d = 128, bf16 operands, "
    "bf16-stored results): the emulation's o is 3.6e-3 from the truth, so a bf16 o gets 2 (3.6e-3 + 1.7e-3) = "
    "1.1e-2; dq, dk, dv, dg, dS0, dbias get 8e-3 .. 9.4e-3, dbeta 1.3e-2, dA_log 5.9e-3. Real faults are O(1e-1 .. 1) "
    "(a wrong sign, a missing term or chunk), 10x - 100x beyond a bf16 budget and ~1e5x beyond an fp32 one "
    "(fp32 emulation ~1e-6)."};
/// Least budget of the `kdalab check` rule: below it the truth and the stored candidate disagree by rounding alone.
inline constexpr Tolerance budget_floor{1e-12,
    "at fp64 the rule's terms are ~1e-16 .. 1e-14, the size of the float64 truth's own rounding and of float64 "
    "summation-order differences between two exact algorithms (backward_f64_vs_mp, check_self); 1e-12 judges no "
    "such noise and still fails any real discrepancy (>= 1e-6)."};
/// `kdalab check` fed the truth itself as the candidate: only the truth's own rounding differs.
inline constexpr Tolerance check_self{1e-12,
    "candidate = the float64-stored truth; the recomputed truth differs by storage rounding (~1e-16) "
    "and float64-vs-mp differences (<= 1e-14); 1e-12 still fails any real discrepancy."};
/// Agreement of a metric that `kdalab check` reports with the same metric computed independently.
inline constexpr Tolerance check_metric_agreement{1e-6,
    "relative RMS of a bf16-rounded candidate (~1.7e-3) computed from two float64 truths that differ "
    "by ~1e-15: the metrics agree to ~1e-12 relative; 1e-6 is loose yet catches a wrong formula."};

// ---- KDA, bf16 inputs and output, fp32 state: kernels and the kernel twin ----------------------

/// bf16 output rounding alone: the floor of any bf16-output kernel.
inline constexpr Tolerance bf16_output_floor{1.7e-3,
    "rounding o itself to bf16 (u = 2^-8) costs ~1.66e-3 relative RMS on anchor-kda outputs."};
/// KDA bf16 kernel and its twin vs the float64 truth on the anchor cases.
inline constexpr Tolerance kda_bf16_goal{2.0e-3,
    "accuracy goal of the KDA kernels: the bf16 output floor 1.66e-3 plus ~0.34e-3 for the state path; the peers "
    "measure 4.0e-3 (fla chunk_kda) and 5.6e-3 (FlashKDA) on the same cases."};
/// Twin vs kernel agreement (relative, on relative RMS): |err_twin - err_kernel| <= 0.1 err_kernel.
inline constexpr Tolerance twin_vs_kernel{0.1,
    "the twin runs the kernel's algorithm at the kernel's precisions; only accumulation order differs, so their "
    "errors agree closely, while a twin whose precision plan differs from the kernel's moves by more than 10%."};
/// The kernel twin's chosen plan (numerics/kda_twin.hpp kda_plan_kernel()) vs the float64 truth.
inline constexpr Tolerance kda_twin_plan{1.8e-3,
    "measured 1.66e-3 .. 1.73e-3 on the anchor cases (bf16 output floor 1.61e-3 .. 1.66e-3); 1.8e-3 catches "
    "a plan change that moves any intra-chunk product to bf16 (all-bf16 gives 3.5e-3 .. 3.8e-3)."};
/// Final state of the twin's chosen plan vs the float64 truth (fp32 state, bf16 state-path operands).
inline constexpr Tolerance kda_twin_state{3.0e-3,
    "the state is stored in fp32; its error comes from the bf16 operands of the d_k x d_v products: measured "
    "2.2e-3 .. 2.5e-3 on the anchor cases (no output rounding in it); 3.0e-3 leaves ~20% margin."};
/// Final state of a KDA kernel (fp32 storage) and its twin vs the float64 truth: the goal on the anchor cases, on
/// long-memory inputs and on near-collinear keys (numerics/kda_twin.hpp, "State-product precision").
inline constexpr Tolerance kda_state_goal{2.5e-3,
    "accuracy goal of the KDA kernels' final state: no output rounding applies (fp32 storage), so the state path's "
    "operand roundings alone count; the kernel plan's bf16 state-product operands give 2.1e-3 .. 2.6e-3 on the anchor "
    "cases and 6.7e-3 .. 2.0e-2 on near-collinear keys with beta = 1, the state hi/lo plan 4e-6 .. 6.7e-4 (the twin's "
    "table). 2.5e-3 is the kernel plan's anchor level with a little margin: a broken hi/lo split falls back to it or "
    "above on the hard inputs."};
/// KDA prefill, wgmma state pass vs the mma.sync state pass (KdaStatePass::wgmma vs ::mma): relative RMS of the
/// difference of o and of S_final.
inline constexpr Tolerance kda_state_wgmma_vs_mma{5e-4,
    "the wgmma state step forms W S, Qg S, the update and P D on the warpgroup tensor cores, whose "
    "fp32 accumulation order differs from mma.sync's (~1e-7 relative); that flips an occasional bf16 rounding of D, o "
    "or the next chunk's S operand (2^-8 relative each): 5e-4 is 0.3 of the bf16 output floor (1.66e-3), far below the "
    "O(1) of a wrong fragment layout, swizzle or descriptor."};

// ---- KDA backward kernel (kernels/kda_backward.hpp): fp32 compute, bf16 inputs -----------------

/// A bf16 gradient of the CUDA KDA backward (dq, dk, dv, dg, dbeta) vs the float64 oracle (reference/kda_backward.hpp
/// with the pre-ops' chain rules) on the same bf16 inputs.
inline constexpr Tolerance kda_bwd_bf16{2.5e-3,
    "everything is computed in fp32 and rounded once to bf16: the rounding alone is the bf16 output floor (~1.66e-3 "
    "relative RMS, bf16_output_floor); the fp32 part (a checkpointed recompute of the state and the reverse sweep, "
    "O(T d) dependent flops with a contracting state, as f32_vs_truth: <= 1e-5) moves it by < 1%. 2.5e-3 = 1.5x the "
    "floor leaves room for a tensor whose bf16 rounding costs more than it does on the anchor outputs, while a wrong "
    "term, sign, token or head gives >= 1e-2 (dk without its S' G^T k term: 1.5e-2 at T = 17). A tensor of a few "
    "elements rounds by more (one element: up to 2^-8 = 3.9e-3), so the test bounds each bf16 gradient by "
    "max(2.5e-3, 1.5x its own rounding floor)."};
/// An fp32 gradient of the CUDA KDA backward (dA_log, dbias, dS0) vs the float64 oracle on the same bf16 inputs.
inline constexpr Tolerance kda_bwd_f32{1e-4,
    "fp32 compute with fp32 output: the per-token terms carry O(T d) dependent fp32 roundings (~1e-6 .. 1e-5, as "
    "f32_vs_truth), and dA_log, dbias sum them over all tokens (in fp64, fixed order), where cancellation between "
    "terms of both signs can magnify the relative error by the ratio of the terms' size to the sum's (~10x on the "
    "test inputs); 1e-4 keeps a 10x margin over that and is 100x below a wrong term."};

/// A bf16 gradient of the chunked KDA backward with its chains on wgmma (KdaBackwardPass::chunked_wg) vs the same
/// gradient of the chunked pass (chains on mma.sync) on the same inputs.
inline constexpr Tolerance kda_bwd_chains_wg_vs_mma{5e-4,
    "the wgmma chains carry the states' products as bf16 hi + lo (~2^-16 = 1.5e-5 relative each) where the mma chains "
    "carry three tf32 passes (~2^-21), and sum in another order; the stored S and dS then differ by ~1e-5 relative, "
    "which moves each fp32 gradient by about as much and flips an occasional bf16 rounding of it (2^-8 relative "
    "each, for ~1e-5 / 2^-8 ~ 0.3% of the elements: ~1e-4 relative RMS). Measured on an H100: <= 1.2e-5 on the "
    "short cases, 1.6e-4 .. 3.2e-4 on long memory at T = 4096, where the states' differences build up over 256 chunks. "
    "5e-4 is 0.3 of the bf16 output floor (1.66e-3), far below the O(1) of a wrong fragment layout, swizzle, "
    "descriptor, chunk order or stage."};

/// Goal of the chunked (tensor-core) KDA backward, per bf16 gradient: its relative RMS against the float64 oracle over
/// the bf16 rounding floor of the oracle's values (docs/kernels/kda_backward.md, "Version 2").
inline constexpr Tolerance kda_bwd_chunk_floor_ratio{1.1,
    "the chunked backward's precision plan is to cost at most 10% above the output format: the bf16 rounding of a "
    "gradient alone is its floor (~1.66e-3), the fp32-class arithmetic below it adds < 1% (the twin's fp32 plan: "
    "1.00x); the forward kernel's plan mirrored gives 1.2x .. 1.5x on the anchor inputs and all-bf16 operands ~2x "
    "(dg ~24x), so 1.1 separates a plan that keeps the floor from one that does not."};

// ---- MLA decode, absorbed, bf16 latent cache, fp32 output --------------------------------------

/// Absorbed MLA decode kernel (attended latent a = softmax(scale q~ C^T) C, fp32 output) vs float64 on
/// the same bf16 latent cache and the exact (unrounded) absorbed query q~.
inline constexpr Tolerance mla_decode_goal{2.0e-3,
    "accuracy goal of the MLA kernels (the KDA kernels' 2.0e-3). The kernel carries q~ and P as bf16 hi + lo "
    "(~2^-16 relative each) with fp32 accumulation, so it should land near 1e-5; a bf16-rounded q~ alone costs "
    "2.3-3.5e-3 and fails."};
/// Absorbed MLA decode kernel in the fast precision (kernels/mla.hpp MlaDecodePrecision::fast: bf16 q~, bf16 P, fp32
/// accumulation; one to four query tokens per sequence, causal among themselves) vs float64 on the same bf16 latent
/// cache and the exact (unrounded) absorbed query q~.
inline constexpr Tolerance mla_decode_fast{6.0e-3,
    "FlashMLA's precision plan: the bf16-rounded q~ costs 2.3-3.5e-3 (the accurate kernel's q-hi-only ablation) and "
    "bf16 P 4.4-4.8e-4 (its P-hi-only ablation); a CPU emulation of the plan's roundings on the GPU tests' inputs "
    "gives 2.1-3.7e-3 over 51 draws of 8 heads (s_q = 1, 2, 4) and 2.5e-3 with 32 heads "
    "(tests/numerics/test_mla_decode_fast_precision.cpp, whose emulation of the accurate plan gives the 3.8e-6 the "
    "kernel measured); FlashMLA itself measured 2.5-5.4e-3 against an fp32-query truth. 6e-3 leaves 1.6x over the "
    "worst emulated draw for the kernel's other roundings (fp32 accumulation order, the combine) and a case that "
    "compares few heads, and still fails a wrong mask, row or slice (O(1e-1) errors)."};

// ---- MLA prefill, causal, bf16 latents, fp32 output --------------------------------------------

/// Gated MLA causal prefill kernel (absorbed: attended latent a = causal softmax(scale q~ C^T) C, fp32)
/// vs float64 on the same bf16 latents and the exact absorbed query q~ (or on the bf16 q^C, W_UK).
inline constexpr Tolerance mla_prefill_goal{2.0e-3,
    "accuracy goal of the MLA kernels. Same precision plan as the decode kernel (q~ and P as bf16 hi + lo, fp32 "
    "accumulation), expected near 1e-5; a bf16-rounded q~ alone would cost 2.3-3.5e-3 and fail."};
/// Gated MLA prefill with per-head output o = W_UV,i a_i (kernels/mla_prefill.hpp mla_prefill_heads), either
/// path, vs float64 reference/mla.hpp mla_attend_naive on the same bf16 q^C, W_UK, W_UV and latents.
inline constexpr Tolerance mla_prefill_heads_goal{2.0e-3,
    "accuracy goal of the MLA kernels. Predicted before the kernel by a CPU emulation (docs/kernels/mla_prefill.md, "
    "naive path): the naive plan (k, v, P as bf16 hi + lo, fp32 accumulation) 3.5e-6 .. 6.1e-6, absorbed + fp32 "
    "W_UV ~1e-5; a plain bf16 flash attention (k, v, P bf16) emulates at 2.4e-3 .. 4.2e-3 and fails."};
/// Naive path with P as bf16 hi only (MlaPrefillOverrides::p_hi_only, an ablation) vs float64.
inline constexpr Tolerance mla_prefill_naive_p_hi{2.0e-3,
    "the CPU emulation of k, v hi + lo with P bf16 gives 0.59e-3 .. 1.12e-3 (logit std 4 .. 1): P's rounding alone; "
    "the 2.0e-3 goal still holds with ~45% margin."};
/// mla_prefill_heads in precision fast (K, V and P bf16, one tensor pass per product, fp32 accumulation and
/// softmax: a standard bf16 flash attention) vs float64 on the same bf16 q^C, W_UK, W_UV and latents.
inline constexpr Tolerance mla_prefill_fast{6.0e-3,
    "the CPU emulation of k, v, P all bf16 gives 2.4e-3 .. 4.2e-3 (logit std 1 .. 4; docs/kernels/mla_prefill.md); "
    "equal keys add bf16(1/n)'s rounding of P (up to 2^-9 relative, the same for every key, not averaged out); "
    "6e-3 is the worst draw with ~40% margin and still fails a wrong mask, row or head (O(1e-1)). On near-one-hot "
    "rows (logit std ~1000) bf16 K alone moves logits by ~1 and swaps near-tied winners (5e-2 measured): there the "
    "kernel is held to this budget against a float64 truth on the same bf16-rounded K and V."};
/// Naive path vs the absorbed path followed by W_UV (same inputs): two evaluations of the same o.
inline constexpr Tolerance mla_prefill_naive_vs_absorbed{1e-4,
    "each path lands ~1e-5 from the float64 truth (hi + lo operands, fp32 accumulation); their difference is "
    "~1e-5; 1e-4 leaves 10x margin and fails any real discrepancy (a wrong mask or head gives >= 1e-2)."};

// ---- Block AttnRes kernel, bf16 sources, fp32 pseudo-query -------------------------------------

/// Block AttnRes kernel, fp32 output, vs float64 on the same bf16 sources and fp32 pseudo-query.
inline constexpr Tolerance attn_res_f32{1e-5,
    "fp32 sums of d <= 16384 products per logit (relative error ~u_fp32 sqrt(d) ~ 1e-6 of |z|, |z| ~ 1-10) and "
    "an fp32 weighted sum of S sources: ~1e-6 observed scale; 1e-5 fails any wrong weight or missing RMSNorm."};
/// Block AttnRes kernel, bf16 output, vs float64: the bf16 output rounding dominates.
inline constexpr Tolerance attn_res_bf16{2.0e-3,
    "rounding the output to bf16 costs ~1.6e-3 relative RMS (the bf16 output floor); the fp32 math adds ~1e-6."};

// ---- recall experiment, float64 memories -------------------------------------------------------

/// Linear attention with random unit keys: measured relative read error / sqrt((N - 1) / d_k) must lie in
/// [1 / f, f].
inline constexpr Tolerance recall_linear_sqrt_factor{1.5,
    "crosstalk of N - 1 random unit keys has variance (N - 1) / d_k per read (docs/equations.md, associative-memory "
    "facts); with >= 8 reads per point the sample RMS stays within ~25% of it at d_k >= 16, and a factor 1.5 still "
    "fails on an erase step (error -> 0) or a missing normalisation (error x sqrt(d_k))."};
/// Softmax memory with inverse temperature 100 on distinct unit keys: the read equals the stored value.
inline constexpr Tolerance recall_softmax_exact{1e-4,
    "the weight of another key is exp(-100 (1 - cos)). The --quick grid's worst point is N = 8 d_k = 128 keys in "
    "d_k = 16, whose largest pairwise cosine has a median of 0.79 and a 99th percentile of 0.89 (300 draws of random "
    "unit keys, numpy): a neighbour's weight <= e^-11 = 1.7e-5 in 99% of draws, a relative read error "
    "<= ~1e-5. (1e-6, justified by cos <= 0.8, held for about half the draws: the seeded run read 1.1e-6 there once "
    "recall's cells got their own generators.) A blurred softmax (scale 1/sqrt(d)) gives errors ~1."};

// ---- Reverse-mode derivatives of the reference (reference/*_backward.hpp) ---------------------------
/// Analytic VJP <J^T dy, dx> vs the central difference (L(x + h dx) - L(x - h dx)) / 2h of
/// L = <dy, f(x)>, both in cpp_bin_float_50 with h = 1e-17: relative error of one directional derivative.
inline constexpr Tolerance backward_fd_mp{1e-25,
    "truncation h^2 L'''/6 ~ 1e-34 and rounding u_mp50 |L| / h ~ 1e-50 / 1e-17 = 1e-33 for O(1) derivatives; "
    "measured <= 1.2e-31 on the unit-test shapes (tests/unit/test_kda_backward.cpp); 1e-25 fails any wrong term (O(1)) and any float64 step (1e-16)."};
/// The same directional derivative from Python (python/tests/test_backward.py): the gradient and the forward
/// in cpp_bin_float_50, each output rounded once to float64, L = <dy, f(x)> summed in float64, step h = 1e-6.
inline constexpr Tolerance backward_fd_f64{1e-7,
    "|error| / max(|<grad, u>|, 1): truncation h^2 L'''/6 ~ 1e-12 and rounding 2^-53 n |dy f| / h ~ 1e-16 x 100 / 1e-6 "
    "= 1e-8 on the test shapes (n <= 100 outputs of O(1)); measured <= 1.4e-9 (python/tests/test_backward.py shapes); a wrong or missing term gives O(1)."};
/// float64 gradients vs the cpp_bin_float_50 gradients of the same inputs, per gradient tensor.
inline constexpr Tolerance backward_f64_vs_mp{1e-13,
    "the reverse sweep repeats the forward's O(T d) dependent flops once more; measured <= 1.6e-15 on T = 64 (recurrence) and "
    "T = 40 (fused op), d_k = d_v = 8; 1e-13 leaves ~60x margin, while a wrong term gives O(1)."};


}  // namespace kdalab::tol
