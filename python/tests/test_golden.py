"""Every oracle function against the golden fixtures data/golden/*.h5 (the cpp_bin_float_50 truth
rounded once to float64): mp50 bit for bit where the fixture was made by the same reference call,
float64 within the budgets of the C++ golden tests (numerics/tolerance.hpp golden_f64, golden_mp)."""
import numpy as np
import pytest

import kdalab

B = kdalab.budgets()
GOLDEN_F64 = B["golden_f64"][0]
GOLDEN_MP = B["golden_mp"][0]


def rel(x, ref):
    return kdalab.check(x, ref, name="x", tol=1.0).rel_rms


def bitwise(x, ref):
    return x.shape == ref.shape and np.array_equal(x.view(np.uint64), np.asarray(ref).view(np.uint64))


def cases(file):
    return str(kdalab.read_attr(file, "/", "cases")).split(",")


def kda_case(file, case):
    r = lambda n: kdalab.read_array(file, f"{case}/{n}")
    has_S0 = kdalab.read_attr(file, case, "has_S0") == "yes"
    args = dict(q=r("q"), k=r("k"), v=r("v"), g=r("g"), beta=r("beta"), S0=r("S0") if has_S0 else None)
    return args, float(kdalab.read_attr(file, case, "scale")), r


@pytest.mark.parametrize("op", ["kda_recurrent", "kda_decode"])
def test_kda_mp50_equals_golden_bit_for_bit(golden, op):
    f = golden(op)
    for case in cases(f):
        args, scale, r = kda_case(f, case)
        if op == "kda_decode":
            o, S = kdalab.kda_decode(**args, scale=scale, precision="mp50")
        else:
            o, S = kdalab.kda_recurrent(**args, scale=scale, precision="mp50")
        assert bitwise(o, r("o")), (op, case, rel(o, r("o")))
        assert bitwise(S, r("S_final")), (op, case, rel(S, r("S_final")))
        if op == "kda_recurrent" and kdalab.read_attr(f, case, "variants") == "yes":
            for var in ["gated_deltanet", "deltanet", "gla", "linear"]:
                o, _ = kdalab.kda_recurrent(**args, scale=scale, variant=var, precision="mp50")
                assert bitwise(o, r(f"o_{var}")), (case, var)


@pytest.mark.parametrize("op", ["kda_recurrent", "kda_decode", "kda_chunked"])
def test_kda_float64_within_golden_budget(golden, op):
    f = golden(op)
    Cs = [int(c) for c in str(kdalab.read_attr(f, "/", "C")).split(",")] if op == "kda_chunked" else [0]
    for case in cases(f):
        args, scale, r = kda_case(f, case)
        for C in Cs:
            if op == "kda_chunked":
                o, S = kdalab.kda_chunked(**args, scale=scale, C=C)
            elif op == "kda_decode":
                o, S = kdalab.kda_decode(**args, scale=scale)
            else:
                o, S = kdalab.kda_recurrent(**args, scale=scale)
            assert rel(o, r("o")) <= GOLDEN_F64, (op, case, C)
            assert rel(S, r("S_final")) <= GOLDEN_F64, (op, case, C)


def test_kda_chunked_mp50_within_golden_mp_budget(golden):
    f = golden("kda_chunked")
    for case in cases(f):
        args, scale, r = kda_case(f, case)
        for C in [1, 16]:
            o, S = kdalab.kda_chunked(**args, scale=scale, C=C, precision="mp50")
            assert rel(o, r("o")) <= GOLDEN_MP and rel(S, r("S_final")) <= GOLDEN_MP, (case, C)


KDA_LAYER_INT = ["hidden", "H", "HV", "d_k", "d_v", "gate_rank", "conv_kernel", "chunk"]
KDA_LAYER_NUM = ["g_min", "l2_eps", "rms_eps", "scale"]


def kda_layer_case(f, case):
    a = lambda n: kdalab.read_attr(f, case, n)
    config = {n: int(a(n)) for n in KDA_LAYER_INT} | {n: float(a(n)) for n in KDA_LAYER_NUM}
    config |= {"gate": a("gate"), "gate_input": a("gate_input")}
    weights = {n: kdalab.read_array(f, f"{case}/w/{n}") for n in kdalab.members(f, f"{case}/w")}
    return kdalab.read_array(f, f"{case}/x"), weights, config


@pytest.mark.parametrize("precision", ["mp50", "float64"])
def test_kda_layer_equals_golden(golden, precision):
    f = golden("kda_layer")
    for case in cases(f):
        x, w, config = kda_layer_case(f, case)
        y, o_core, S = kdalab.kda_layer(x, w, config, precision=precision)
        for got, name in [(y, "y"), (o_core, "o_core"), (S, "S_final")]:
            ref = kdalab.read_array(f, f"{case}/{name}")
            if precision == "mp50":
                assert bitwise(got, ref), (case, name, rel(got, ref))
            else:
                assert rel(got, ref) <= GOLDEN_F64, (case, name)


MLA_INT = ["hidden", "n_h", "d_c", "d_cq", "d_nope", "d_rope", "d_v"]


def mla_case(f, case):
    a = lambda n: kdalab.read_attr(f, case, n)
    config = {n: int(a(n)) for n in MLA_INT}
    config |= {"rope": a("rope") == "yes", "output_gate": a("output_gate") == "yes", "rope_theta": float(a("rope_theta"))}
    weights = {n: kdalab.read_array(f, f"{case}/w/{n}") for n in kdalab.members(f, f"{case}/w")}
    return kdalab.read_array(f, f"{case}/x"), weights, config


@pytest.mark.parametrize("precision", ["mp50", "float64"])
@pytest.mark.parametrize("ev", ["naive", "absorbed"])
def test_mla_equals_golden(golden, precision, ev):
    f = golden("mla")
    for case in cases(f):
        x, w, config = mla_case(f, case)
        y = kdalab.mla(x, w, config, eval=ev, precision=precision)
        ref = kdalab.read_array(f, f"{case}/y_{ev}")
        if precision == "mp50":
            assert bitwise(y, ref), (case, rel(y, ref))
        else:
            assert rel(y, ref) <= GOLDEN_F64, case


@pytest.mark.parametrize("precision", ["mp50", "float64"])
@pytest.mark.parametrize("mode", ["full", "block"])
def test_attn_res_equals_golden(golden, precision, mode):
    f = golden("attn_res")
    for case in cases(f):
        a = lambda n: kdalab.read_attr(f, case, n)
        h = kdalab.attn_res(kdalab.read_array(f, f"{case}/v"), kdalab.read_array(f, f"{case}/w"), mode=mode,
                            block_sources=int(a("block_sources")), eps=float(a("eps")), precision=precision)
        ref = kdalab.read_array(f, f"{case}/h_{mode}")
        if precision == "mp50":
            assert bitwise(h, ref), (case, rel(h, ref))
        else:
            assert rel(h, ref) <= GOLDEN_F64, case
