"""Adapters of `kdalab verify`: what each cannot run is "not applicable" with its reason; options are checked;
the budget rule is one swappable function; the pytest utilities of kdalab.testing."""
import numpy as np
import pytest

import kdalab
from kdalab import testing
from kdalab.verify import NA, make_adapter, run
from kdalab.verify import budgets as budgets_mod
from kdalab.verify.candidates import numpy_kda, numpy_mla_decode
from kdalab.verify.cases import find, with_params
from kdalab.verify.properties import check_case


def inputs(name, **params):
    return with_params([find(name)], params)[0].inputs()


def test_flashkda_needs_128_wide_heads():
    r = make_adapter("flashkda", numpy_kda).supports(inputs("agree/T17"))
    assert "K = V = 128" in r


def test_flashkda_needs_equal_key_and_value_heads():
    r = make_adapter("flashkda", numpy_kda).supports(inputs("agree/hv2h", d_k=128, d_v=128))
    assert "HV = H" in r


def test_in_kernel_l2norm_cannot_run_unnormalized_keys():
    r = make_adapter("fla-chunk:l2norm=kernel", numpy_kda).supports(inputs("adv/key-norm-huge"))
    assert "un-normalized" in r


def test_fused_gate_needs_exact_gate_logits_and_beta_logits_exact_logits():
    x = inputs("agree/T17")
    del x["g_raw"]
    assert "gate logits" in make_adapter("fla-recurrent:gate=fused", numpy_kda).supports(x)
    y = inputs("agree/T17")
    del y["beta_raw"]
    assert "beta logit" in make_adapter("fla-chunk:beta=logits", numpy_kda).supports(y)


def test_long_memory_case_gives_exact_gate_and_beta_logits():
    x = inputs("adv/long-memory")
    assert "logit" not in (make_adapter("fla-chunk:gate=fused,beta=logits", numpy_kda).supports(x) or "")
    np.testing.assert_array_equal(x["beta"], 1.0 / (1.0 + np.exp(-x["beta_raw"])))
    np.testing.assert_array_equal(x["g"], x["g_min"] / (1.0 + np.exp(-np.exp(x["A_log"])[:, None] * (x["g_raw"] + x["bias"]))))


def test_long_memory_beta_logit_must_be_exact_in_bf16():
    """A logit kernel reads beta_raw rounded to bf16; a logit bf16 cannot hold would give it another beta than the
    oracle's, so the case cannot be generated (not applicable, with the reason)."""
    assert inputs("adv/long-memory", T=4, beta_logit=-3.5)["beta_raw"][0, 0, 0] == -3.5
    with pytest.raises(ValueError, match=r"^long_memory: beta_logit = 0.3 is not exact in bf16 .*; accepted: a bf16 "
                                         r"value, e.g. -4.125$"):
        inputs("adv/long-memory", T=4, beta_logit=0.3)
    r = run(numpy_kda, "kda", ["adv/long-memory"], params={"T": 4, "beta_logit": 0.3}, printer=None).results[0]
    assert r.kind == NA and "beta_logit = 0.3 is not exact in bf16" in r.detail


@pytest.mark.parametrize("case", ["adv/repeated-keys", "adv/collinear-keys", "grad/repeated-keys", "grad/collinear-keys"])
def test_a_key_run_past_the_tokens_is_not_applicable_not_a_crash(case):
    """--param T shorter than a case's run of repeated or collinear keys (t0 = 2, 5 keys): the case cannot be
    generated (not applicable, with the reason), rather than an IndexError that ends the whole run."""
    with pytest.raises(ValueError, match=r"keys t0 = 2 \.\. t0 \+ reps - 1 = 6 do not fit in T = 3 tokens"):
        inputs(case, T=3)
    r = run(numpy_kda, "kda", [case], params={"T": 3}, printer=None).results[0]
    assert r.kind == NA and "do not fit in T = 3 tokens" in r.detail
    assert run(numpy_kda, "kda", [case], params={"T": 7}, printer=None).results[0].passed  # the run just fits


@pytest.mark.parametrize("param", [{"N": 0}, {"B": 0}, {"n_h": 0}, {"d_c": -8}])
def test_an_empty_mla_decode_shape_is_not_applicable_not_a_crash(param):
    """--param N=0 (or B, n_h, d_c < 1) for the MLA decode cases: not applicable with the reason; the run does not
    end in an exception (N = 0 would divide by zero)."""
    (key, value), = param.items()
    r = run(numpy_mla_decode, "mla_decode", ["mla/agree"], params=param, printer=None).results[0]
    assert r.kind == NA and f"{key} = {value}; accepted: {key} >= 1" in r.detail


@pytest.mark.parametrize("n, log2_scale", [(1, 24), (16, 16)])
def test_the_value_outlier_scales_exactly_its_tokens_by_a_power_of_two(n, log2_scale):
    """value_outlier draws random_kda's inputs and multiplies v of tokens t0 .. t0 + n - 1 (every sequence and value
    head) by 2^log2_scale, exact; everything else is the same draw."""
    from kdalab.verify.cases import random_kda, value_outlier
    kw = {"B": 2, "T": 40, "H": 1, "HV": 2}
    base, x = random_kda(5, **kw), value_outlier(5, t0=20, n=n, log2_scale=log2_scale, **kw)
    for name in ("q", "k", "g", "beta", "S0"):
        np.testing.assert_array_equal(x[name], base[name])
    expect = np.array(base["v"], copy=True)
    expect[:, 20:20 + n] *= 2.0 ** log2_scale
    np.testing.assert_array_equal(x["v"], expect)
    assert not np.array_equal(x["v"], base["v"])


@pytest.mark.parametrize("case, params, reason", [
    ("agree/T17", {"H": 0}, "H = 0; accepted: H >= 1"),
    ("agree/T17", {"T": -5}, "T = -5; accepted: T >= 1"),
    ("agree/T17", {"d_k": -1}, "d_k = -1; accepted: d_k >= 1"),
    ("adv/raw-qk-huge", {"log2_scale": 2000}, "OverflowError"),
    ("adv/varlen-hundreds", {"max_len": 0}, "short_sequences: n = 200, max_len = 0"),
    ("adv/varlen-hundreds", {"n": 0}, "short_sequences: n = 0"),
    ("adv/large-state", {"state": False}, "large_state: state = false leaves no initial state"),
    ("adv/v-outlier-token", {"T": 100}, "value_outlier: tokens 176..176 of T = 100; accepted:"),
    ("layout/state-roundtrip", {"state": False}, "needs an initial state"),
    ("adv/collinear-keys", {"eps": float("nan")}, "inputs hold NaN or Inf (k, k_raw)"),
    ("adv/long-memory", {"T": 40, "g_min": float("nan")}, "inputs hold NaN or Inf"),
])
def test_a_parameter_override_a_case_cannot_take_is_not_applicable_not_a_crash(case, params, reason):
    """--param values the generators cannot take (a zero or negative size, 2^2000, no state for a state case, an
    empty varlen draw, whose sampling would never end, a NaN that makes NaN inputs, which is not the candidate's
    NaN): the case is not applicable with the reason; the run goes on."""
    r = run(numpy_kda, "kda", [case], params=params, printer=None).results[0]
    assert r.kind == NA and reason in r.detail, r.detail


def test_kdalab_cuda_adapter_is_guarded_without_cuda_entry_points():
    if kdalab.built_with_cuda:
        pytest.skip("this kdalab has its CUDA entry points")
    x = inputs("agree/T17")
    assert "CUDA" in make_adapter("kdalab-cuda", None).supports(x)


def test_adapter_for_another_op_is_not_applicable():
    assert "mla_decode" in make_adapter("mla-canonical", numpy_kda).supports(inputs("agree/T17"))


@pytest.mark.parametrize("spec, names", [("canonical:precision=fp8", "fp8"), ("canonical:colour=red", "colour"),
                                         ("fla-chunk:state", "key=value"), ("fla-chunk:gate=softplus", "softplus"),
                                         ("kdalab-cuda:gate=fused,gate=precomputed", "option 'gate' is given twice"),
                                         ("kdalab-cuda:precision=hilo", "precision = 'hilo'; accepted: fast, accurate")])
def test_bad_adapter_option_names_itself(spec, names):
    with pytest.raises(ValueError, match=names):
        make_adapter(spec, numpy_kda)


def test_declared_precision_picks_the_budget_of_the_check_rule():
    x = inputs("agree/T17")
    b = {p: budgets_mod.budget("kda", p, "o", x) for p in ("float64", "float32", "bf16")}
    rule = kdalab.budget_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], x["S0"], scale=x["scale"], precision="bf16")
    assert b["bf16"].tol == rule["o"].value and b["bf16"].rule == "rule:F=2 emulation bf16, output bf16"
    assert b["float64"].tol == kdalab.BUDGET_FLOOR
    assert b["float64"].tol < b["float32"].tol < b["bf16"].tol


def test_budget_emulates_the_form_the_adapter_hands_the_candidate():
    x = inputs("agree/T17")
    fused = make_adapter("fla-chunk:gate=fused,beta=logits,l2norm=kernel", numpy_kda)
    b = budgets_mod.budget("kda", "bf16", "o", x, fused)
    raw = kdalab.budget_kda(x["q_raw"], x["k_raw"], x["v"], x["g_raw"], x["beta_raw"], x["S0"], scale=x["scale"],
                            precision="bf16", output_format={"o": "bf16", "S": "float32"}, gate="k3", A_log=x["A_log"],
                            bias=x["bias"], g_min=x["g_min"], l2norm_qk=True, beta_logits=True)
    assert b.tol == raw["o"].value
    assert budgets_mod.budget("kda", "bf16", "S", x, fused).rule == "rule:F=2 emulation bf16, output fp32"


def test_budget_rule_is_one_swappable_function(monkeypatch):
    # a candidate with a known error inside the float64 budget: the float64 recurrence itself may equal the truth bit
    # for bit (then half its error would be a budget of 0, which the checker refuses)
    def off_by_1e14(*a, **kw):
        o, S = numpy_kda(*a, **kw)
        return o * (1 + 1e-14), S
    case = find("agree/T17")
    ok = check_case(make_adapter("canonical", off_by_1e14), case)
    assert ok.passed and ok.rel_rms > 0
    monkeypatch.setattr(budgets_mod, "budget",
                        lambda op, p, q, x, *a: budgets_mod.Budget(ok.rel_rms / 2, "test", "half the error"))
    over = check_case(make_adapter("canonical", off_by_1e14), case)
    assert over.verdict == "over budget by 2x"


def test_report_names_the_rule_of_every_comparison():
    r = check_case(make_adapter("canonical:precision=bf16", numpy_kda), find("agree/T17"))
    assert r.passed and r.detail.count("rule:F=2 emulation bf16, output bf16") == 2, r.detail


def test_mla_cases_can_be_sized_for_kdalabs_decode_kernel():
    from kdalab.verify.cases import catalogue
    for c in with_params(catalogue("mla_decode"), {"n_h": 16, "d_c": 512}):
        x = c.inputs()
        assert x["q"].shape[-2:] == (16, 512) and x["cache"].shape[2] == 512, c.name


def test_kdalab_mla_kernel_takes_the_multi_token_cases_and_names_s_q_where_it_cannot():
    from kdalab.verify.cases import catalogue, mla_decode_random
    mtp = [c for c in with_params(catalogue("mla_decode"), {"n_h": 16, "d_c": 512}) if c.params.get("s_q", 1) > 1]
    assert mtp, "the catalogue has multi-token decode cases"
    for spec in ("kdalab-mla-cuda", "kdalab-mla-cuda:precision=fast"):
        a = make_adapter(spec, numpy_mla_decode)
        for c in mtp:  # s_q <= 4 at the kernel's sizes: only the build or the GPU can stand in the way
            why = a.supports(c.inputs())
            assert why is None or "s_q" not in why, (spec, c.name, why)
    accurate = make_adapter("kdalab-mla-cuda:precision=accurate", numpy_mla_decode)
    for c in mtp:
        why = accurate.supports(c.inputs())
        assert why and f"s_q = {c.params['s_q']}" in why, (c.name, why)
    why = make_adapter("kdalab-mla-cuda", numpy_mla_decode).supports(
        mla_decode_random(5, s_q=5, n_h=16, d_c=512, N=9))
    assert why and "s_q = 5" in why, why
    with pytest.raises(ValueError, match="precision = 'hilo'; accepted: auto, accurate, fast"):
        make_adapter("kdalab-mla-cuda:precision=hilo", numpy_mla_decode)


def test_kdalab_kernel_adapters_run_their_own_entry_point_without_a_candidate(tmp_path):
    from kdalab.verify.cli import main
    out = str(tmp_path / "r.h5")
    # at the default sizes every case is not applicable (exit 4) in any build; the report names the candidate run
    assert main(["--op", "mla_decode", "--adapter", "kdalab-mla-cuda", "--cases", "mla/len1", "--out", out,
                 "--quiet"]) == 4
    assert kdalab.read_attr(out, "/verify", "candidate") == "kdalab._core:cuda_mla_decode"


def test_bf16_rounded_candidate_is_within_bf16_noise_not_float64():
    def rounded(*a, **kw):
        o, S = numpy_kda(*a, **kw)
        return (o.astype(np.float32) * (1 + 2.0**-9)).astype(np.float64), S
    rep = run(rounded, "kda", ["agree/T65"], adapter="canonical:precision=bf16", printer=None)
    assert rep.results[0].passed
    rep = run(rounded, "kda", ["agree/T65"], adapter="canonical:precision=float64", printer=None)
    assert rep.results[0].verdict.startswith("over budget by")


def test_batch_spread_is_reported_when_the_candidate_declares_no_exact_order():
    def spread(q, k, v, g, beta, **kw):
        o, S = numpy_kda(q, k, v, g, beta, **kw)
        return o * (1 + 1e-15 * (q.shape[0] > 1)), S
    r = check_case(make_adapter("canonical:exact=no", spread), find("batch/B3"))
    assert r.passed and "not bit-identical" in r.detail
    r = check_case(make_adapter("canonical:exact=yes", spread), find("batch/B3"))
    assert r.verdict == "property broken" and "not bit-identical" in r.detail


def test_determinism_spread_is_reported():
    calls = []

    def jitter(*a, **kw):
        calls.append(1)
        o, S = numpy_kda(*a, **kw)
        return o * (1 + 1e-15 * (len(calls) % 2)), S
    r = check_case(make_adapter("canonical", jitter), find("determinism/T65"))
    assert r.verdict == "property broken" and "max |diff|" in r.detail


@testing.parametrize_cases("kda", props=["causality", "continuation"])
def test_parametrize_cases_gives_one_test_per_case(case):
    testing.assert_case_passes(numpy_kda, case)


def test_assert_case_passes_names_the_case_and_seed():
    def wrong(*a, **kw):
        o, S = numpy_kda(*a, **kw)
        return o * 1.01, S
    case = find("agree/T17")
    with pytest.raises(AssertionError, match=r"agree/T17 \(agreement\) seed 117.*\n.*random_kda\(seed=117, "):
        testing.assert_case_passes(wrong, case)


def test_assert_case_passes_skips_what_the_adapter_cannot_run():
    with pytest.raises(pytest.skip.Exception, match=NA):
        testing.assert_case_passes(numpy_kda, find("agree/T17"), adapter="flashkda")


def test_a_complex_output_is_broken_never_read_as_its_real_part():
    def complex_kda(*a, **k):
        o, S = numpy_kda(*a, **k)
        return o + 1e-3j, S
    r = run(complex_kda, "kda", ["agree/T17"], printer=None).results[0]
    assert r.verdict == "property broken" and "complex" in r.detail, r.detail


def test_fla_gradients_are_judged_only_in_the_canonical_form():
    x = inputs("grad/agree")
    r = make_adapter("fla-chunk:gate=fused,beta=logits,l2norm=kernel", numpy_kda).backward_reason(x)
    assert "gate=precomputed,l2norm=off,beta=prob" in r
    r = make_adapter("fla-chunk", numpy_kda).backward_reason(x)  # canonical options: only the device is missing
    assert r is None or "canonical" not in r
