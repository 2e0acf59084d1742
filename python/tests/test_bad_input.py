"""Bad input raises kdalab.Error (a ValueError) carrying the C++ message, which names the tensor or
option, the value and what is accepted: wrong dtype, shape, layout, device, non-finite values, out of
range options."""
import re

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


NOT_ARRAYS = [([[1.0, 2.0]], "list"), ("abc", "str"), (2.0, "float"),
              (np.array([1.0, 2.0], dtype=object), r"numpy.ndarray of dtype object"),
              (np.array([1.0, 2.0], dtype=">f8"), r"numpy.ndarray of dtype >f8")]


@pytest.mark.parametrize("value, kind", NOT_ARRAYS)
def test_an_argument_that_is_no_array_names_the_tensor(value, kind):
    # nanobind's own TypeError ("incompatible function arguments") named neither the argument nor what is accepted
    accepted = r", not an array kdalab reads; accepted: a numpy array or torch tensor"
    a, s = inputs()
    raises(rf"tensor 'k' is a {kind}{accepted}", kdalab.kda_recurrent, **(a | {"k": value}), scale=s)
    raises(rf"tensor 'S0' is a {kind}{accepted}", kdalab.kda_decode, **(a | {"S0": value}), scale=s)
    raises(rf"tensor 'w' is a {kind}{accepted}", kdalab.attn_res, np.ones((2, 2, 4)), value, mode="full")
    raises(rf"tensor 'truth' is a {kind}{accepted}", kdalab.check, np.ones(2), value)
    raises(rf"tensor 'W_q' is a {kind}{accepted}", kdalab.kda_layer, np.ones((3, 8)), {"W_q": value}, {})
    raises(rf"tensor 'z' is a {kind}{accepted}", kdalab.gate, value, np.zeros(1), np.zeros((1, 2)))


def test_none_for_a_required_array_is_the_binding_layers_type_error():
    # nanobind refuses None for an argument that does not take it before any conversion runs, so it stays a
    # TypeError (with the signature); None where an array is optional (S0, dS_T) means "absent"
    a, s = inputs()
    with pytest.raises(TypeError, match=r"incompatible function arguments"):
        kdalab.kda_recurrent(**(a | {"k": None}), scale=s)
    o, S = kdalab.kda_recurrent(**(a | {"S0": None}), scale=s)
    assert np.isfinite(o).all()


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


def test_beta_outside_zero_one_names_beta_and_the_range():
    # beta is the erase strength of the delta rule, documented in [0, 1]: outside it the output was returned unchecked
    a, s = inputs()
    dO = np.ones_like(a["v"])
    calls = [(kdalab.kda_recurrent, {}), (kdalab.kda_chunked, {}), (kdalab.kda_decode, {}),
             (kdalab.kda_recurrent_backward, {"dO": dO}), (kdalab.kda_chunked_backward, {"dO": dO})]
    for value in [1.5, -0.5, 1e300]:
        b = a["beta"].copy()
        b[0, 2, 1] = value
        for fn, extra in calls:
            raises(rf"tensor 'beta' has beta = {re.escape(f'{value:g}')} at flat index 5; accepted: beta in \[0, 1\]", fn,
                   **(a | {"beta": b}), **extra, scale=s)
    for edge in [0.0, 1.0]:  # the closed interval is accepted
        o, S = kdalab.kda_recurrent(**(a | {"beta": np.full_like(a["beta"], edge)}), scale=s)
        assert np.isfinite(o).all() and np.isfinite(S).all()


def test_gate_parameters_that_make_the_log_decay_non_finite_are_refused():
    # e^A_log beyond float64 made the softplus gate's g -inf and the bounded gate's NaN at z + bias = 0, returned as such
    T, HV, dk = 3, 2, 4
    z, A_log, bias = np.zeros((T, HV * dk)), np.zeros(HV), np.zeros((HV, dk))
    big = np.array([0.0, 1000.0])
    raises(r"gate: tensor 'A_log' = 1000 at head 1 with z \+ bias = 0 at token 0, column 4 gives a non-finite "
           r"log-decay g .*; accepted: A_log and bias that keep e\^A_log \(z \+ bias\) and g finite in float64",
           kdalab.gate, z, big, bias, kind="bounded")
    raises(r"gate: tensor 'A_log' = 1000 at head 1 .* non-finite log-decay g \(-inf\)", kdalab.gate, z, big, bias,
           kind="softplus")
    raises(r"gate: tensor 'A_log' = 1000 at head 1", kdalab.gate_backward, z, big, bias, np.ones_like(z),
           kind="softplus")
    raises(r"gate: tensor 'bias' has a non-finite value at flat index 5", kdalab.gate, z, A_log,
           np.where(np.arange(HV * dk).reshape(HV, dk) == 5, np.inf, 0.0))
    # the bounded gate saturates finitely at g_min where z + bias != 0, but its derivative there is inf * 0
    g = kdalab.gate(np.ones_like(z), np.full(HV, 800.0), bias, kind="bounded", g_min=-5.0)
    assert (g == -5.0).all()
    raises(r"gate_backward: tensor 'A_log' = 800 at head 0 with z \+ bias = 1 at token 0, column 0 gives a non-finite "
           r"derivative of the gate; accepted: A_log and bias that keep e\^A_log \(z \+ bias\) finite in float64",
           kdalab.gate_backward, np.ones_like(z), np.full(HV, 800.0), bias, np.ones_like(z), kind="bounded")


def kda_layer_weights(hidden=8, d=4):
    """Weights of a one-head KDA layer (H = HV = 1, d_k = d_v = d, gate_rank d, conv_kernel 4)."""
    rng = np.random.default_rng(5)
    shapes = {"W_q": (d, hidden), "W_k": (d, hidden), "W_v": (d, hidden), "conv_q": (d, 4), "conv_k": (d, 4),
              "conv_v": (d, 4), "W_beta": (1, hidden), "W_a_down": (d, hidden), "W_a_up": (d, d), "W_alpha": (d, d),
              "g_bias": (1, d), "W_g": (d, hidden), "W_o": (hidden, d), "A_log": (1,), "rms_w": (d,)}
    return {n: 0.3 * rng.standard_normal(sh) for n, sh in shapes.items()}, {"hidden": hidden, "H": 1, "HV": 1,
                                                                             "d_k": d, "d_v": d}


def test_non_finite_kda_layer_weights_name_the_weight():
    # a NaN or Inf weight reached every output as NaN, returned without an error
    w, config = kda_layer_weights()
    x = np.ones((3, 8))
    y, o_core, S = kdalab.kda_layer(x, w, config)
    assert np.isfinite(y).all()
    for name, value in [("W_q", np.inf), ("rms_w", np.nan), ("A_log", -np.inf), ("W_o", np.nan)]:
        bad = w[name].copy()
        bad.flat[1 if bad.size > 1 else 0] = value
        raises(rf"KdaWeights: tensor '{name}' has a non-finite value \({value}\) at flat index "
               rf"{1 if bad.size > 1 else 0}; only finite values are accepted", kdalab.kda_layer, x, w | {name: bad},
               config)


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


def test_check_of_empty_tensors_is_refused_not_passed():
    raises(r"tensor 'o' has shape \[0\]: no elements to compare", kdalab.check, np.zeros(0), np.zeros(0), name="o")
    raises(r"tensor 'o' has shape \[2, 0\]: no elements", kdalab.check, np.zeros((2, 0)), np.zeros((2, 0)), name="o")


def test_uniform_bounds_that_leave_no_interval_raise_instead_of_hanging():
    # boost's draw repeats until a value < b: with these it would never return (an infinite bound is outside its domain)
    for a, b in [(1.0, 1.0), (1.0, 0.0), (np.nan, 1.0), (0.0, np.nan), (0.0, np.inf), (-np.inf, 0.0)]:
        raises(r"Rng.uniform: a = .*, b = .* is not accepted; give finite a < b", kdalab.Rng(1).uniform, 3, a, b)
    assert kdalab.Rng(1).uniform(3, -1.0, -0.5).shape == (3,)
