"""The budget rule of `kdalab check` from Python (kdalab.budget_of, budget_kda, budget_mla; numerics/budget.hpp):
value = max(F (emulation + output rounding), floor), the emulation at the declared precision and the truth on
exactly the given inputs."""
import numpy as np
import pytest

import kdalab


def kda(T=17, H=2, HV=2, d=16, seed=5, B=1):
    x = kdalab.kda_inputs(B, T, HV, d, d, seed=seed)
    return {n: np.ascontiguousarray(x[n][:, :, :H]) if n in ("q", "k", "q_raw", "k_raw") else x[n] for n in x}


def test_budget_of_is_f_times_the_two_terms_or_the_floor():
    truth = np.array([1.0, -2.0, 0.5, 4.0])  # bf16-exact: no output rounding
    b = kdalab.budget_of(truth * (1 + 1e-3), truth, precision="bf16", output_format="bf16")
    assert b.emulation == pytest.approx(1e-3, rel=1e-9) and b.output_rounding == 0.0
    assert b.value == pytest.approx(kdalab.BUDGET_FACTOR * 1e-3, rel=1e-9)
    b = kdalab.budget_of(truth, truth * (1 + 2.0**-12), precision="fp64", output_format="bf16")
    assert b.output_rounding > 0 and b.value == pytest.approx(kdalab.BUDGET_FACTOR * (b.emulation + b.output_rounding))
    assert kdalab.budget_of(truth, truth, precision="fp64", output_format="fp64").value == kdalab.BUDGET_FLOOR
    assert b.label == "rule:F=2 emulation fp64, output bf16" and "F = 2" in b.rule


def test_kda_budgets_of_each_quantity_follow_the_declared_precision():
    x = kda()
    by = {p: kdalab.budget_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], x["S0"], scale=x["scale"], precision=p)
          for p in ("float64", "float32", "bf16")}
    for q in ("o", "S"):
        assert by["float64"][q].value == kdalab.BUDGET_FLOOR
        assert 1e-8 < by["float32"][q].value < 1e-5 < 1e-3 < by["bf16"][q].value < 5e-2, (q, by)
        b = by["bf16"][q]
        assert b.value == pytest.approx(kdalab.BUDGET_FACTOR * (b.emulation + b.output_rounding))
        assert b.emulation > 0 and b.output_rounding > 0 and b.precision == "bf16" and b.output_format == "bf16"


def test_output_format_sets_the_rounding_term_only():
    x = kda()
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], x["S0"])
    a = kdalab.budget_kda(*args, scale=x["scale"], precision="bf16")
    b = kdalab.budget_kda(*args, scale=x["scale"], precision="bf16", output_format={"S": "fp32"})
    assert b["o"].value == a["o"].value and b["S"].emulation == a["S"].emulation
    assert b["S"].output_rounding < 1e-6 < a["S"].output_rounding and b["S"].output_format == "fp32"


def test_varlen_budget_of_one_sequence_is_the_plain_budget():
    x = kda(T=23)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], x["S0"])
    a = kdalab.budget_kda(*args, scale=x["scale"], precision="bf16")
    b = kdalab.budget_kda(*args, scale=x["scale"], precision="bf16", cu_seqlens=[0, 23])
    assert [(a[q].emulation, a[q].value) for q in "oS"] == [(b[q].emulation, b[q].value) for q in "oS"]
    c = kdalab.budget_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], np.concatenate([x["S0"]] * 2), scale=x["scale"],
                          precision="bf16", cu_seqlens=[0, 9, 23])
    assert c["o"].value != a["o"].value  # two sequences: the state restarts at token 9


def test_gate_and_logit_form_is_emulated_with_its_preops():
    x = kda()
    b = kdalab.budget_kda(x["q_raw"], x["k_raw"], x["v"], x["g_raw"], x["beta_raw"], x["S0"], scale=x["scale"],
                          precision="bf16", gate="k3", A_log=x["A_log"], bias=x["bias"], g_min=x["g_min"],
                          l2norm_qk=True, beta_logits=True)
    a = kdalab.budget_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], x["S0"], scale=x["scale"], precision="bf16")
    assert b["o"].value == pytest.approx(a["o"].value, rel=0.3)  # the same truth, slightly different roundings


def test_gradient_budgets_name_every_gradient():
    x = kda(T=20)
    dO = kdalab.Rng(3).normal(x["v"].size).reshape(x["v"].shape)
    b = kdalab.budget_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], x["S0"], scale=x["scale"], precision="bf16", dO=dO)
    assert set(b) == {"o", "S", "dq", "dk", "dv", "dg", "dbeta", "dS0"}
    assert all(1e-3 < b[n].value < 1e-1 for n in b), b
    g = kdalab.budget_kda(x["q"], x["k"], x["v"], x["g_raw"], x["beta"], x["S0"], scale=x["scale"], precision="bf16",
                          gate="k3", A_log=x["A_log"], bias=x["bias"], dO=dO)
    assert {"dA_log", "dbias"} <= set(g)


def test_mla_decode_budget_reads_each_rows_cache_length():
    r = kdalab.Rng(4)
    q, c = r.normal(2 * 4 * 32).reshape(2, 1, 4, 32), r.normal(2 * 20 * 32).reshape(2, 20, 32)
    full = kdalab.budget_mla(q, c, scale=32**-0.5, precision="bf16")
    same = kdalab.budget_mla(q, c, scale=32**-0.5, precision="bf16", lens=[20, 20])
    short = kdalab.budget_mla(q, c, scale=32**-0.5, precision="bf16", lens=[20, 3])
    assert full["o"].value == same["o"].value != short["o"].value
    assert 1e-3 < full["o"].value < 5e-2 and kdalab.budget_mla(q, c, scale=0.1, precision="fp64")["o"].value == 1e-12
    g = kdalab.budget_mla(q, c, scale=0.1, precision="bf16", dO=r.normal(q.size).reshape(q.shape))
    assert set(g) == {"o", "dq", "dc"}


@pytest.mark.parametrize("kw, names", [({"precision": "fp8"}, "precision"),
                                       ({"precision": "bf16", "output_format": {"dq": "bf16"}}, "dq"),
                                       ({"precision": "bf16", "output_format": "int8"}, "output_format"),
                                       ({"precision": "bf16", "gate": "k3"}, "A_log"),
                                       ({"precision": "bf16", "chunk": 0}, "chunk")])
def test_bad_budget_argument_names_itself(kw, names):
    x = kda()
    with pytest.raises(kdalab.Error, match=names):
        kdalab.budget_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], x["S0"], scale=x["scale"], **kw)
