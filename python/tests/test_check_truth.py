"""The oracle functions equal the command line's `kdalab check` truth on the golden fixtures' inputs,
bit for bit, in float64 and in cpp_bin_float_50. The input files for `check` are written with
kdalab.ResultsFile in the format of docs/check-format.md. Needs the kdalab binary: KDALAB_BIN, or
build/default/experiments/kdalab; skipped without it."""
import os
import pathlib
import subprocess

import numpy as np
import pytest

import kdalab
from conftest import ROOT


def kdalab_bin():
    p = os.environ.get("KDALAB_BIN") or str(ROOT / "build" / "default" / "experiments" / "kdalab")
    if not pathlib.Path(p).is_file():
        pytest.skip(f"no kdalab binary at {p} (set KDALAB_BIN): the command line's truth cannot be computed")
    return p


def bitwise(x, ref):
    return x.shape == ref.shape and np.array_equal(x.view(np.uint64), ref.view(np.uint64))


def run_check(tmp_path, op, truth, write):
    inp, out = tmp_path / f"in_{op}_{truth}.h5", tmp_path / f"out_{op}_{truth}.h5"
    with kdalab.ResultsFile(str(inp)) as f:
        write(f)
    r = subprocess.run([kdalab_bin(), "check", "--op", op, "--truth", truth, "--in", str(inp), "--out", str(out),
                        "--quiet"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return lambda name: kdalab.read_array(str(out), f"check/{name}")


@pytest.mark.parametrize("truth,precision", [("f64", "float64"), ("mp", "mp50")])
@pytest.mark.parametrize("op,fixture,case", [("kda", "kda_recurrent", "anchor"),
                                             ("kda", "kda_recurrent", "softplus_wide_dv24_noS0"),
                                             ("kda-decode", "kda_decode", "anchor_decode")])
def test_kda_equals_check_truth(golden, tmp_path, truth, precision, op, fixture, case):
    f = golden(fixture)
    r = lambda n: kdalab.read_array(f, f"{case}/{n}")
    has_S0 = kdalab.read_attr(f, case, "has_S0") == "yes"
    scale = float(kdalab.read_attr(f, case, "scale"))

    def write(h):
        for n in ["q", "k", "v", "g", "beta"]:
            h.write_array("/", n, r(n), units="1", description=n)
        if has_S0:
            h.write_array("/", "S0", r("S0"), units="1", description="S0", attrs={"layout": "KV"})
        h.attr("/", "scale", scale)
        h.attr("/", "l2norm_qk", 0.0)

    t = run_check(tmp_path, op, truth, write)
    args = dict(q=r("q"), k=r("k"), v=r("v"), g=r("g"), beta=r("beta"), S0=r("S0") if has_S0 else None)
    if op == "kda-decode":
        o, S = kdalab.kda_decode(**args, scale=scale, precision=precision)
    else:
        o, S = kdalab.kda_recurrent(**args, scale=scale, precision=precision)
    assert bitwise(o, t("o_truth"))
    assert bitwise(S, t("S_truth"))


@pytest.mark.parametrize("truth,precision", [("f64", "float64"), ("mp", "mp50")])
@pytest.mark.parametrize("mode", ["full", "block"])
def test_attn_res_equals_check_truth(golden, tmp_path, truth, precision, mode):
    f = golden("attn_res")
    case = "d32_N8_block3"
    v, w = kdalab.read_array(f, f"{case}/v"), kdalab.read_array(f, f"{case}/w")
    bs, eps = int(kdalab.read_attr(f, case, "block_sources")), float(kdalab.read_attr(f, case, "eps"))

    def write(h):
        h.write_array("/", "v", v, units="1", description="v")
        h.write_array("/", "w", w, units="1", description="w")
        h.attr("/", "mode", mode)
        h.attr("/", "block_sources", float(bs))
        h.attr("/", "eps", eps)

    t = run_check(tmp_path, "attn-res", truth, write)
    h = kdalab.attn_res(v, w, mode=mode, block_sources=bs, eps=eps, precision=precision)
    assert bitwise(h, t("h_truth"))
