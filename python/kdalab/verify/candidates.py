"""Plain numpy candidates in kdalab's canonical calling convention (adapter "canonical").

They are candidates only: `kdalab verify` drives them like any other kernel and never uses them as a
truth (the truth is kdalab's C++ oracle). They show what the canonical convention looks like and serve
as the correct baseline of the planted-fault tests.
"""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np


def numpy_kda(q, k, v, g, beta, *, scale: float, initial_state: Optional[np.ndarray] = None,
              cu_seqlens: Optional[np.ndarray] = None) -> Tuple[np.ndarray, np.ndarray]:
    """KDA by its recurrence, one token at a time (K3 report Eq. 1; docs/equations.md section 1):
    S_t = Diag(exp(g_t)) S_{t-1} + beta_t k_t (v_t - (Diag(exp(g_t)) S_{t-1})^T k_t)^T,  o_t = scale S_t^T q_t.

    q, k [B, T, H, d_k]; v [B, T, HV, d_v]; g [B, T, HV, d_k]; beta [B, T, HV]; initial_state
    [N, HV, d_k, d_v] or None (zeros); cu_seqlens [N + 1] (B = 1, sequences packed along T) or None
    (N = B). Returns (o [B, T, HV, d_v], S [N, HV, d_k, d_v]), float64."""
    q, k, v, g, beta = (np.asarray(a, dtype=np.float64) for a in (q, k, v, g, beta))
    B, T, H, d_k = q.shape
    HV, d_v = v.shape[2], v.shape[3]
    if cu_seqlens is None:
        spans = [(b, 0, T) for b in range(B)]
    else:
        cu = [int(c) for c in cu_seqlens]
        spans = [(0, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]
    N = len(spans)
    S_all = np.zeros((N, HV, d_k, d_v)) if initial_state is None else np.array(initial_state, dtype=np.float64)
    o = np.zeros((B, T, HV, d_v))
    head = np.arange(HV) // (HV // H)
    for n, (b, t0, t1) in enumerate(spans):
        S = S_all[n].copy()
        for t in range(t0, t1):
            qt, kt = q[b, t][head], k[b, t][head]                       # [HV, d_k]
            S = np.exp(g[b, t])[:, :, None] * S
            read = np.einsum("hkv,hk->hv", S, kt)
            S = S + beta[b, t][:, None, None] * kt[:, :, None] * (v[b, t] - read)[:, None, :]
            o[b, t] = scale * np.einsum("hkv,hk->hv", S, qt)
        S_all[n] = S
    return o, S_all


def numpy_mla_decode(q, cache, cache_seqlens, *, scale: float) -> np.ndarray:
    """Absorbed MLA decode (DeepSeek-V2 Eqs. 9-19, W_UK folded into q; docs/equations.md section 5):
    o_{b,i} = sum_{tau < L_b} softmax_tau(scale q_{b,i} . c_{b,tau}) c_{b,tau}.
    q [B, n_h, d_c]; cache [B, N, d_c]; cache_seqlens [B]. Returns o [B, n_h, d_c], float64. q [B, s_q, n_h, d_c]
    (multi-token decode): query j is the cache's token L_b - s_q + j and reads tau <= L_b - s_q + j; o [B, s_q, n_h,
    d_c]."""
    q, cache = np.asarray(q, dtype=np.float64), np.asarray(cache, dtype=np.float64)
    q4 = q if q.ndim == 4 else q[:, None]
    s_q = q4.shape[1]
    o = np.zeros(q4.shape)
    for b in range(q4.shape[0]):
        for j in range(s_q):
            c = cache[b, :int(cache_seqlens[b]) - s_q + 1 + j]
            s = scale * (q4[b, j] @ c.T)
            p = np.exp(s - s.max(axis=1, keepdims=True))
            o[b, j] = (p / p.sum(axis=1, keepdims=True)) @ c
    return o if q.ndim == 4 else o[:, 0]


def numpy_kda_backward(q, k, v, g, beta, dO, *, scale: float, initial_state: Optional[np.ndarray] = None):
    """Reverse-mode gradient of L = <dO, o> through numpy_kda (no varlen): with A = Diag(exp(g_t)) S_{t-1},
    u = v_t - A^T k_t, S_t = A + beta_t k_t u^T, o_t = scale S_t^T q_t. Returns {"dq", "dk" [B, T, H, d_k] (summed
    over a key head's value heads), "dv" [B, T, HV, d_v], "dg" [B, T, HV, d_k], "dbeta" [B, T, HV],
    "dS0" [B, HV, d_k, d_v]}."""
    q, k, v, g, beta, dO = (np.asarray(a, dtype=np.float64) for a in (q, k, v, g, beta, dO))
    B, T, H, d_k = q.shape
    HV, d_v = v.shape[2], v.shape[3]
    head = np.arange(HV) // (HV // H)
    S0 = np.zeros((B, HV, d_k, d_v)) if initial_state is None else np.asarray(initial_state, dtype=np.float64)
    out = {"dq": np.zeros(q.shape), "dk": np.zeros(k.shape), "dv": np.zeros(v.shape), "dg": np.zeros(g.shape),
           "dbeta": np.zeros(beta.shape), "dS0": np.zeros(S0.shape)}
    for b in range(B):
        states = [S0[b].copy()]
        for t in range(T):
            A = np.exp(g[b, t])[:, :, None] * states[-1]
            u = v[b, t] - np.einsum("hkv,hk->hv", A, k[b, t][head])
            states.append(A + beta[b, t][:, None, None] * k[b, t][head][:, :, None] * u[:, None, :])
        dS = np.zeros((HV, d_k, d_v))
        for t in range(T - 1, -1, -1):
            qt, kt, a, bt = q[b, t][head], k[b, t][head], np.exp(g[b, t]), beta[b, t][:, None]
            Sp, St = states[t], states[t + 1]
            A = a[:, :, None] * Sp
            u = v[b, t] - np.einsum("hkv,hk->hv", A, kt)
            dS = dS + scale * qt[:, :, None] * dO[b, t][:, None, :]
            np.add.at(out["dq"][b, t], head, scale * np.einsum("hkv,hv->hk", St, dO[b, t]))
            dSk = np.einsum("hkv,hk->hv", dS, kt)
            out["dv"][b, t] = bt * dSk
            out["dbeta"][b, t] = np.einsum("hv,hv->h", dSk, u)
            np.add.at(out["dk"][b, t], head,
                      bt * np.einsum("hkv,hv->hk", dS, u) - bt * np.einsum("hkv,hv->hk", A, dSk))
            dA = dS - bt[:, :, None] * kt[:, :, None] * dSk[:, None, :]
            out["dg"][b, t] = a * np.einsum("hkv,hkv->hk", dA, Sp)
            dS = a[:, :, None] * dA
        out["dS0"][b] = dS
    return out


numpy_kda.backward = numpy_kda_backward
