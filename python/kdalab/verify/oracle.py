"""The truth of a case from kdalab's C++ oracle (kdalab._core); no oracle math here, only how a case's
tensors are handed to it.

KDA: kdalab.kda_recurrent (K3 report Eq. 1; docs/equations.md section 1); a varlen case is run one
sequence at a time (the oracle has no cu_seqlens), each from its own S0 slot.
MLA decode: kdalab.mla (DeepSeek-V2 Eqs. 9-19) on a layer whose weights are 0/1 selection matrices, so
that the layer is exactly the absorbed attention core: x_t = [c_t | q_0 | ... | q_{n_h-1}],
W_DKV picks c_t, W_Q picks the queries, W_UK = W_UV = I per head, no output gate, W_o puts the n_h
attended latents back into x's query slots. Products with 0/1 weights are exact, so the layer's
output row L-1 is the decode output over a cache of L tokens; its softmax scale is 1/sqrt(d_c).
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np

import kdalab


def kda_truth(x: Dict[str, Any], precision: str = "float64") -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """(o [B, T, HV, d_v], S [N, HV, d_k, d_v]) of a KDA case."""
    cu = x.get("cu_seqlens")
    if cu is None:
        return kdalab.kda_recurrent(x["q"], x["k"], x["v"], x["g"], x["beta"], x["S0"], scale=x["scale"],
                                    precision=precision)
    o = np.zeros(x["v"].shape)
    states = []
    for n in range(len(cu) - 1):
        a, b = int(cu[n]), int(cu[n + 1])
        part = {k: np.ascontiguousarray(x[k][:, a:b]) for k in ("q", "k", "v", "g", "beta")}
        s0 = None if x["S0"] is None else np.ascontiguousarray(x["S0"][n:n + 1])
        on, sn = kdalab.kda_recurrent(part["q"], part["k"], part["v"], part["g"], part["beta"], s0,
                                      scale=x["scale"], precision=precision)
        o[:, a:b] = on
        states.append(sn)
    return o, np.concatenate(states, axis=0)


def _mla_selection_layer(n_h: int, d_c: int):
    hidden = (n_h + 1) * d_c
    eye = np.eye(d_c)
    W_DKV = np.zeros((d_c, hidden))
    W_DKV[:, :d_c] = eye
    W_Q = np.zeros((n_h * d_c, hidden))
    W_Q[:, d_c:] = np.eye(n_h * d_c)
    W_UK = np.ascontiguousarray(np.tile(eye, (n_h, 1)))
    W_o = np.zeros((hidden, n_h * d_c))
    W_o[d_c:, :] = np.eye(n_h * d_c)
    weights = {"W_DKV": W_DKV, "W_KR": np.zeros((0, hidden)), "W_Q": W_Q, "W_UK": W_UK, "W_UV": W_UK.copy(),
               "W_o": W_o}
    config = {"hidden": hidden, "n_h": n_h, "d_c": d_c, "d_nope": d_c, "d_v": d_c, "output_gate": False}
    return weights, config


def mla_decode_truth(x: Dict[str, Any], precision: str = "float64") -> Tuple[np.ndarray, None]:
    """(o [B, n_h, d_c], None) of an MLA decode case (the scale must be 1/sqrt(d_c))."""
    q, cache, lens = x["q"], x["cache"], x["cache_seqlens"]
    B, n_h, d_c = q.shape
    if not np.isclose(x["scale"], 1.0 / np.sqrt(d_c), rtol=1e-15, atol=0.0):
        raise ValueError(f"mla decode truth: scale = {x['scale']}; accepted: 1/sqrt(d_c) = {1 / np.sqrt(d_c)}")
    weights, config = _mla_selection_layer(n_h, d_c)
    o = np.zeros((B, n_h, d_c))
    for b in range(B):
        L = int(lens[b])
        xin = np.zeros((L, (n_h + 1) * d_c))
        xin[:, :d_c] = cache[b, :L]
        xin[L - 1, d_c:] = q[b].reshape(-1)
        y = kdalab.mla(xin, weights, config, eval="absorbed", precision=precision)
        o[b] = y[L - 1, d_c:].reshape(n_h, d_c)
    return o, None


def truth(x: Dict[str, Any], precision: str = "float64"):
    """(output, final state or None) of any case."""
    return kda_truth(x, precision) if x["op"] == "kda" else mla_decode_truth(x, precision)
