"""The truth of a case from kdalab's C++ oracle (kdalab._core); no oracle math here, only how a case's
tensors are handed to it.

KDA: kdalab.kda_recurrent (K3 report Eq. 1; docs/equations.md section 1); a varlen case is run one
sequence at a time (the oracle has no cu_seqlens), each from its own S0 slot.
MLA decode: kdalab.mla_attend (the attention core of DeepSeek-V2 Eqs. 9-19, reference/mla.hpp
mla_attend_absorbed) with W_UK = W_UV = I per head and no rope part, which is exactly the absorbed decode
attention: the one query of row b (q_C = its n_h absorbed queries side by side) reads cache rows 0 .. L_b - 1;
products with the identity are exact; the softmax scale is 1/sqrt(d_nope) = 1/sqrt(d_c). (The core, not the
whole layer on 0/1 selection weights: those weights are [n_h d_c, (n_h + 1) d_c], 2 GB at n_h = 32, d_c = 512.)
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


def mla_decode_truth(x: Dict[str, Any], precision: str = "float64") -> Tuple[np.ndarray, None]:
    """(o, None) of an MLA decode case (the scale must be 1/sqrt(d_c)): q [B, n_h, d_c] -> o [B, n_h, d_c]; q [B, s_q,
    n_h, d_c] (multi-token decode) -> o [B, s_q, n_h, d_c], query j of sequence b reading its cache positions
    0 .. L_b - s_q + j (the queries are the last s_q cached tokens, causal among themselves)."""
    q, cache, lens = x["q"], x["cache"], x["cache_seqlens"]
    multi = q.ndim == 4
    q4 = q if multi else q[:, None]
    B, s_q, n_h, d_c = q4.shape
    if not np.isclose(x["scale"], 1.0 / np.sqrt(d_c), rtol=1e-15, atol=0.0):
        raise ValueError(f"mla decode truth: scale = {x['scale']}; accepted: 1/sqrt(d_c) = {1 / np.sqrt(d_c)}")
    eye = np.ascontiguousarray(np.tile(np.eye(d_c), (n_h, 1)))  # W_UK = W_UV = I per head
    o = np.zeros((B, s_q, n_h, d_c))
    for b in range(B):
        for j in range(s_q):
            L = int(lens[b]) - s_q + 1 + j  # the positions query j reads
            q_C = np.ascontiguousarray(q4[b, j].reshape(1, n_h * d_c), dtype=np.float64)
            C = np.ascontiguousarray(cache[b, :L], dtype=np.float64)
            y = kdalab.mla_attend(q_C, np.zeros((1, 0)), C, np.zeros((L, 0)), eye, eye, n_h=n_h, eval="absorbed",
                                  precision=precision)
            o[b, j] = y.reshape(n_h, d_c)
    return (o if multi else o[:, 0]), None


def truth(x: Dict[str, Any], precision: str = "float64"):
    """(output, final state or None) of any case."""
    return kda_truth(x, precision) if x["op"] == "kda" else mla_decode_truth(x, precision)
