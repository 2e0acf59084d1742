"""Arrays cross into the C++ core through the buffer protocol or DLPack: any DLPack producer (torch
tensors among them) gives the same bits as numpy; a GPU tensor is refused with the tensor named."""
import numpy as np
import pytest

import kdalab

NAMES = ["q", "k", "v", "g", "beta", "S0"]


class DLPackOnly:
    """An array that offers nothing but the DLPack protocol (no buffer protocol, not numpy)."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, *args, **kwargs):
        return self._a.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def inputs():
    d = kdalab.anchor_kda(1, 5, 2, 8, 3)
    return {n: d[n] for n in NAMES}, d["scale"]


def test_a_dlpack_producer_gives_the_bits_of_numpy():
    a, s = inputs()
    o, S = kdalab.kda_recurrent(**a, scale=s)
    o2, S2 = kdalab.kda_recurrent(**{n: DLPackOnly(t) for n, t in a.items()}, scale=s)
    assert np.array_equal(o, o2) and np.array_equal(S, S2)
    with pytest.raises(kdalab.Error, match=r"tensor 'S0' of shape \[1, 2, 8, 8\] is not C-contiguous"):
        kdalab.kda_recurrent(**(a | {"S0": DLPackOnly(np.asfortranarray(a["S0"]))}), scale=s)


def test_torch_tensors_in_and_cuda_tensors_refused():
    torch = pytest.importorskip("torch")
    a, s = inputs()
    ref_o, ref_S = kdalab.kda_recurrent(**a, scale=s)
    o, S = kdalab.kda_recurrent(**{n: torch.from_numpy(t) for n, t in a.items()}, scale=s)
    assert np.array_equal(o, ref_o) and np.array_equal(S, ref_S)
    t = torch.from_numpy(a["q"])
    with pytest.raises(kdalab.Error, match=r"tensor 'q' has dtype float32; accepted: float64"):
        kdalab.kda_recurrent(**(a | {"q": t.float()}), scale=s)
    with pytest.raises(kdalab.Error, match=r"tensor 'q' .* is not C-contiguous"):
        kdalab.kda_recurrent(**(a | {"q": t.transpose(1, 2)}), scale=s)
    c = kdalab.check(torch.from_numpy(ref_o).to(torch.bfloat16), ref_o, name="o")
    assert 0 < c.rel_rms < 4e-3 and c.max_ulp_bf16 <= 1
    if torch.cuda.is_available():
        with pytest.raises(kdalab.Error, match=r"tensor 'q' is on a GPU .* pass q.cpu\(\)"):
            kdalab.kda_recurrent(**(a | {"q": t.cuda()}), scale=s)
