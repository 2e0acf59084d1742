"""The named input generators equal the C++ ones: the pinned checksums of
tests/numerics/test_generator_checksum.cpp, and the golden fixtures' stored raw inputs redrawn from
their recorded generator and seed."""
import numpy as np
import pytest

import kdalab

RAW = ["q_raw", "k_raw", "v", "g_raw", "beta_raw", "A_log", "bias", "S0"]


def test_first_values_of_seed_1_have_the_pinned_checksum():
    rng = kdalab.Rng(1)
    xs = np.concatenate([rng.normal(1000), rng.uniform(1000, 0.0, 1.0)])
    assert kdalab.fnv1a64(xs) == 0x1ACB46E822EC2440


def test_anchor_kda_inputs_have_the_pinned_checksum():
    d = kdalab.anchor_kda(1, 17, 2, 128, 7)
    assert d["generator"] == "anchor-kda" and d["scale"] == 1.0 / np.sqrt(128.0)
    assert kdalab.fnv1a64(np.concatenate([d[n].ravel() for n in RAW])) == 0xD6A038D00A86E3D4
    assert d["q"].shape == (1, 17, 2, 128) and d["beta"].shape == (1, 17, 2) and d["S0"].shape == (1, 2, 128, 128)
    assert np.all((d["g"] <= 0) & (d["g"] >= -5))


def test_cell_seed_is_pinned():
    assert kdalab.cell_seed(1, "recall keys=random d_k=16 N=16") == 0xC855E077727C07D2


def test_kda_inputs_with_the_anchor_settings_is_anchor_kda():
    a, b = kdalab.anchor_kda(2, 5, 3, 16, 11), kdalab.kda_inputs(2, 5, 3, 16, 16, seed=11)
    for n in RAW + ["q", "k", "g", "beta"]:
        assert np.array_equal(a[n], b[n]), n


@pytest.mark.parametrize("op", ["kda_recurrent", "kda_decode", "kda_chunked"])
def test_golden_raw_inputs_are_redrawn_from_generator_and_seed(golden, op):
    f = golden(op)
    for case in str(kdalab.read_attr(f, "/", "cases")).split(","):
        a = lambda n: kdalab.read_attr(f, case, n)
        spec = dict(gate=a("gate"), beta=a("beta"), g_min=float(a("g_min")), seed=int(a("seed")))
        d = kdalab.kda_inputs(int(a("B")), int(a("T")), int(a("H")), int(a("d_k")), int(a("d_v")), **spec)
        assert d["generator"] == a("generator")
        for n in RAW:
            assert np.array_equal(d[n], kdalab.read_array(f, f"{case}/{n}")), (case, n)
