"""The gradient functions (reference/*_backward.hpp) from Python: each one's directional derivative
<grad, u> equals the central difference of L(x) = <dy, f(x)> along a random direction u, for every
input, with the forward function of the same module in mp50 (numerics/tolerance.hpp backward_fd_f64);
the float64 gradients equal the mp50 ones within backward_f64_vs_mp; bad upstream gradients raise."""
import numpy as np
import pytest

import kdalab

B = kdalab.budgets()
FD = B["backward_fd_f64"][0]
F64_VS_MP = B["backward_f64_vs_mp"][0]
STEP = 1e-6  # central-difference step (the reason of backward_fd_f64)


def rel(x, ref):
    return kdalab.check(x, ref, name="x", tol=1.0).rel_rms


def kda_problem(seed, B=1, T=6, H=1, HV=2, dk=3, dv=2):
    r = np.random.default_rng(seed)
    k = r.standard_normal((B, T, H, dk))
    x = dict(q=r.standard_normal((B, T, H, dk)), k=k / np.linalg.norm(k, axis=-1, keepdims=True),
             v=r.standard_normal((B, T, HV, dv)), g=-r.uniform(0.05, 1.0, (B, T, HV, dk)),
             beta=r.uniform(0.2, 0.9, (B, T, HV)), S0=r.standard_normal((B, HV, dk, dv)))
    up = dict(dO=r.standard_normal((B, T, HV, dv)), dS_T=r.standard_normal((B, HV, dk, dv)))
    return x, up, dk ** -0.5


def mla_problem(seed, n_h=2, d_nope=3, d_rope=2, d_v=2, d_c=4, T=3, N=5):
    r = np.random.default_rng(seed)
    x = dict(q_C=r.standard_normal((T, n_h * d_nope)), q_R=r.standard_normal((T, n_h * d_rope)),
             C=r.standard_normal((N, d_c)), K_R=r.standard_normal((N, d_rope)),
             W_UK=r.standard_normal((n_h * d_nope, d_c)) / 2, W_UV=r.standard_normal((n_h * d_v, d_c)) / 2)
    return x, r.standard_normal((T, n_h * d_v)), n_h


def gate_problem(seed, T=4, HV=2, dk=3):
    r = np.random.default_rng(seed)
    x = dict(z=r.standard_normal((T, HV * dk)), A_log=r.uniform(-1, 0.5, HV), bias=r.standard_normal((HV, dk)))
    return x, r.standard_normal((T, HV * dk))


def attn_res_problem(seed, N=6, T=3, d=5):
    r = np.random.default_rng(seed)
    return dict(v=r.standard_normal((N, T, d)), w=r.standard_normal(d)), r.standard_normal((T, d))


# Each case: (inputs, loss L(x) from the forward in mp50, gradients as a dict "d<name>" in `precision`).
def kda_recurrent_case(variant):
    x, up, scale = kda_problem(11)

    def loss(a):
        o, S = kdalab.kda_recurrent(**a, scale=scale, variant=variant, precision="mp50")
        return np.sum(up["dO"] * o) + np.sum(up["dS_T"] * S)

    grad = lambda precision: kdalab.kda_recurrent_backward(**x, **up, scale=scale, variant=variant, checkpoint=4,
                                                           precision=precision)
    return x, loss, grad


def kda_chunked_case():
    x, up, scale = kda_problem(12, T=7)

    def loss(a):
        o, S = kdalab.kda_chunked(**a, scale=scale, C=3, precision="mp50")
        return np.sum(up["dO"] * o) + np.sum(up["dS_T"] * S)

    return x, loss, lambda precision: kdalab.kda_chunked_backward(**x, **up, scale=scale, C=3, precision=precision)


def gate_case(kind):
    x, dg = gate_problem(13)
    loss = lambda a: np.sum(dg * kdalab.gate(**a, kind=kind, g_min=-4.0, precision="mp50"))
    return x, loss, lambda precision: kdalab.gate_backward(**x, dg=dg, kind=kind, g_min=-4.0, precision=precision)


def attn_res_case(mode):
    x, dh = attn_res_problem(14)
    loss = lambda a: np.sum(dh * kdalab.attn_res(**a, mode=mode, block_sources=2, precision="mp50"))
    return x, loss, lambda precision: kdalab.attn_res_backward(**x, dh=dh, mode=mode, block_sources=2,
                                                               precision=precision)


def mla_case(eval):
    x, dO, n_h = mla_problem(15)
    loss = lambda a: np.sum(dO * kdalab.mla_attend(**a, n_h=n_h, eval=eval, precision="mp50"))
    return x, loss, lambda precision: kdalab.mla_attend_backward(**x, dO=dO, n_h=n_h, eval=eval, precision=precision)


CASES = {
    **{f"kda_recurrent_backward[{v}]": (lambda v=v: kda_recurrent_case(v))
       for v in ("kda", "gated_deltanet", "deltanet", "gla", "linear")},
    "kda_chunked_backward": kda_chunked_case,
    "gate_backward[bounded]": lambda: gate_case("bounded"),
    "gate_backward[softplus]": lambda: gate_case("softplus"),
    "attn_res_backward[full]": lambda: attn_res_case("full"),
    "attn_res_backward[block]": lambda: attn_res_case("block"),
    "mla_attend_backward[naive]": lambda: mla_case("naive"),
    "mla_attend_backward[absorbed]": lambda: mla_case("absorbed"),
}


@pytest.mark.parametrize("name", CASES)
def test_gradient_equals_central_difference_for_every_input(name):
    x, loss, grad = CASES[name]()
    g = grad("mp50")
    assert sorted(g) == sorted("d" + n for n in x)
    r = np.random.default_rng(99)
    for n, x0 in x.items():
        assert g["d" + n].shape == x0.shape, n
        u = r.standard_normal(x0.shape)
        an = np.sum(g["d" + n] * u)
        fd = (loss(x | {n: x0 + STEP * u}) - loss(x | {n: x0 - STEP * u})) / (2 * STEP)
        err = abs(fd - an) / max(abs(an), 1.0)
        assert err <= FD, f"{name}: d{n}: <grad, u> = {an!r}, central difference {fd!r}, error {err:.2e}"


@pytest.mark.parametrize("name", CASES)
def test_float64_gradients_equal_mp50_within_budget(name):
    _, _, grad = CASES[name]()
    g64, gmp = grad("float64"), grad("mp50")
    for n in gmp:
        if np.any(gmp[n]):
            assert rel(g64[n], gmp[n]) <= F64_VS_MP, f"{name}: {n}"
        else:  # e.g. dg of the variants without a per-channel decay
            assert not np.any(g64[n]), f"{name}: {n}"


def test_bad_upstream_gradients_raise_naming_the_tensor():
    x, up, scale = kda_problem(16)
    with pytest.raises(kdalab.Error, match=r"tensor 'dO' has shape \[1, 6, 2, 3\], expected \[1, 6, 2, 2\]"):
        kdalab.kda_recurrent_backward(**x, dO=np.ones((1, 6, 2, 3)), scale=scale)
    with pytest.raises(kdalab.Error, match=r"tensor 'dS_T' has a non-finite value"):
        kdalab.kda_chunked_backward(**x, dO=up["dO"], dS_T=np.full(up["dS_T"].shape, np.nan), scale=scale, C=2)
    with pytest.raises(kdalab.Error, match=r"C = 0 is not accepted"):
        kdalab.kda_chunked_backward(**x, dO=up["dO"], scale=scale, C=0)
    m, dO, n_h = mla_problem(17)
    with pytest.raises(kdalab.Error, match=r"tensor 'dO' has shape \[3, 5\]; expected \[T, n_h d_v\] = \[3, 4\]"):
        kdalab.mla_attend_backward(**m, dO=np.ones((3, 5)), n_h=n_h)
    with pytest.raises(kdalab.Error, match=r"tensor 'C' has shape \[2, 4\]; expected \[N >= T = 3, d_c >= 1\]"):
        kdalab.mla_attend(**(m | {"C": m["C"][:2].copy()}), n_h=n_h)
    a, dh = attn_res_problem(18)
    with pytest.raises(kdalab.Error, match=r"tensor 'dh' has shape \[3, 4\]; expected \[T, d\] = \[3, 5\]"):
        kdalab.attn_res_backward(**a, dh=dh[:, :4].copy(), mode="full")
    gx, dg = gate_problem(19)
    with pytest.raises(kdalab.Error, match=r"tensor 'dg' is \[4, 5\], expected the shape of 'z' \[4, 6\]"):
        kdalab.gate_backward(**gx, dg=dg[:, :5].copy())
