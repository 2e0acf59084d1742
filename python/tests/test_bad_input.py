"""Bad input raises kdalab.Error (a ValueError) carrying the C++ message, which names the tensor or
option, the value and what is accepted: wrong dtype, shape, layout, device, non-finite values, out of
range options."""
import numpy as np
import pytest

import kdalab


def inputs(B=1, T=5, H=2, D=8):
    d = kdalab.anchor_kda(B, T, H, D, 3)
    return dict(q=d["q"], k=d["k"], v=d["v"], g=d["g"], beta=d["beta"], S0=d["S0"]), d["scale"]


def raises(match, fn, *a, **k):
    with pytest.raises(kdalab.Error, match=match) as e:
        fn(*a, **k)
    assert isinstance(e.value, ValueError)
    return str(e.value)


def test_wrong_dtype_names_the_tensor_and_float64():
    a, s = inputs()
    a["k"] = a["k"].astype(np.float32)
    raises(r"tensor 'k' has dtype float32; accepted: float64", kdalab.kda_recurrent, **a, scale=s)


def test_wrong_shape_names_the_tensor_and_the_expected_shape():
    a, s = inputs()
    a["g"] = a["g"][:, :, :, :4].copy()
    raises(r"tensor 'g' has shape \[1, 5, 2, 4\], expected \[1, 5, 2, 8\]", kdalab.kda_recurrent, **a, scale=s)
    a, s = inputs()
    raises(r"tensor 'S0' has shape", kdalab.kda_chunked, **(a | {"S0": a["S0"][0]}), scale=s)


def test_non_contiguous_names_the_tensor():
    a, s = inputs()
    a["v"] = np.asfortranarray(a["v"])
    raises(r"tensor 'v' of shape \[1, 5, 2, 8\] is not C-contiguous", kdalab.kda_recurrent, **a, scale=s)
    raises(r"tensor 'w' of shape \[8\] is not C-contiguous", kdalab.attn_res, np.ones((3, 2, 8)),
           np.ones(16)[::2], mode="full")


def test_nan_names_the_tensor_and_flat_index():
    a, s = inputs()
    a["q"] = a["q"].copy()
    a["q"][0, 1, 0, 2] = np.nan
    raises(r"tensor 'q' has a non-finite value \(nan\) at flat index 18", kdalab.kda_recurrent, **a, scale=s)
    raises(r"tensor 'v' has a non-finite value", kdalab.attn_res, np.full((2, 2, 4), np.inf), np.ones(4), mode="full")


def test_out_of_range_values_and_options():
    a, s = inputs()
    raises(r"tensor 'g' \(log-decay\) has g = .* > 0", kdalab.kda_recurrent, **(a | {"g": -a["g"]}), scale=s)
    raises(r"scale = -1 is not accepted", kdalab.kda_recurrent, **a, scale=-1.0)
    raises(r"option 'C' \(chunk size\) = 0", kdalab.kda_chunked, **a, scale=s, C=0)
    raises(r"C = -1 is not accepted", kdalab.kda_chunked, **a, scale=s, C=-1)
    raises(r"variant = 'gdn' is unknown; accepted: kda, gated_deltanet", kdalab.kda_recurrent, **a, scale=s,
           variant="gdn")
    raises(r"precision = 'float32' is unknown; accepted: float64, mp50", kdalab.kda_recurrent, **a, scale=s,
           precision="float32")
    raises(r"mode = 'sum' is unknown; accepted: full, block", kdalab.attn_res, np.ones((2, 2, 4)), np.ones(4),
           mode="sum")
    raises(r"gate = 'k4' is unknown", kdalab.kda_inputs, 1, 2, 1, 4, 4, gate="k4")


def test_layer_configs_and_weights_are_checked():
    x = np.ones((3, 8))
    raises(r"mla config: option 'n_heads' is unknown; accepted: hidden n_h", kdalab.mla, x, {},
           {"hidden": 8, "n_heads": 2})
    raises(r"mla config: option 'n_h' is required", kdalab.mla, x, {}, {"hidden": 8, "d_c": 4, "d_nope": 2, "d_v": 2})
    raises(r"kda_layer weights: tensor 'W_q' is missing", kdalab.kda_layer, x, {},
           {"hidden": 8, "H": 1, "HV": 1, "d_k": 4, "d_v": 4})
    raises(r"kda_layer config: option 'chunk' = '-2'", kdalab.kda_layer, x, {},
           {"hidden": 8, "H": 1, "HV": 1, "d_k": 4, "d_v": 4, "chunk": -2})
    raises(r"mla weights: tensor 'W_x' is unknown", kdalab.mla, x, {"W_x": np.ones((2, 2))},
           {"hidden": 8, "n_h": 1, "d_c": 4, "d_nope": 2, "d_v": 2})


def test_candidate_dtype_and_shape_in_check():
    raises(r"tensor 'o' has dtype int64; accepted: float64, float32, bfloat16", kdalab.check,
           np.ones(4, dtype=np.int64), np.ones(4), name="o")
    raises(r"tensor 'o' has shape \[4\], the truth has \[2, 2\]", kdalab.check, np.ones(4), np.ones((2, 2)), name="o")


def test_uniform_bounds_that_leave_no_interval_raise_instead_of_hanging():
    # boost's draw repeats until a value < b: with these it never returned (an infinite bound crashed)
    for a, b in [(1.0, 1.0), (1.0, 0.0), (np.nan, 1.0), (0.0, np.nan), (0.0, np.inf), (-np.inf, 0.0)]:
        raises(r"Rng.uniform: a = .*, b = .* is not accepted; give finite a < b", kdalab.Rng(1).uniform, 3, a, b)
    assert kdalab.Rng(1).uniform(3, -1.0, -0.5).shape == (3,)
