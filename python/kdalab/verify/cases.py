"""The case catalogue of `kdalab verify`: named, seeded input generators and the cases built on them.

A case is one generator call (a name from GENERATORS, a seed and keyword parameters) plus the property
it checks (kdalab.verify.properties.PROPERTIES) and that property's parameters. Its inputs are
kdalab's canonical tensors (docs/verify.md, "Canonical tensors"):

KDA: q, k [B, T, H, d_k]; v [B, T, HV, d_v]; g [B, T, HV, d_k] (log-decay, g <= 0);
beta [B, T, HV]; S0 [N, HV, d_k, d_v] ("KV" layout) or None; scale; cu_seqlens [N + 1] int64 or
None (then B = 1 and the N sequences are packed along T). Where the gate and beta are given as logits
too, the case also holds g_raw [B, T, HV, d_k], A_log [HV], bias [HV, d_k], g_min (the K3 bounded gate
g = g_min Sigmoid(exp(A_log) (g_raw + bias)), docs/equations.md section 2) and beta_raw [B, T, HV]
(beta = Sigmoid(beta_raw)), chosen so that the derived g and beta are exact in float64 or derived by
kdalab's C++ generator. unit_qk says q and k have unit L2 norm (a candidate that normalizes q and k
in its kernel sees the same inputs up to rounding).

MLA decode: q [B, n_h, d_c] (the absorbed query), cache [B, N, d_c] (the latent cache),
cache_seqlens [B] int64 (1 <= L_b <= N), scale; the output o [B, n_h, d_c] is the attended latent.

Inputs come from kdalab's seeded generators (kdalab.kda_inputs, kdalab.Rng); the adversarial ones
edit them by copying, scaling by powers of two and overwriting with constants, so a generator call
with its seed reproduces its inputs exactly on every machine.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

import kdalab

# T at or above this is a long case: the CPU default skips it (`--long` runs it).
LONG_T = 1000


@dataclasses.dataclass(frozen=True)
class Case:
    """One catalogue entry: the generator call and the property it checks."""
    name: str
    op: str                      # "kda" or "mla_decode"
    generator: str               # a key of GENERATORS
    seed: int
    params: Dict[str, Any]       # keyword parameters of the generator
    prop: str                    # a key of kdalab.verify.properties.PROPERTIES
    prop_params: Dict[str, Any] = dataclasses.field(default_factory=dict)
    long: bool = False           # skipped unless long cases are asked for
    about: str = ""              # what the case is for, one line

    def call(self) -> str:
        """The generator call as text, e.g. `repeated_keys(seed=3, B=1, T=64)`: the reproducer."""
        args = ", ".join(f"{k}={v!r}" for k, v in sorted(self.params.items()))
        return f"{self.generator}(seed={self.seed}{', ' if args else ''}{args})"

    def inputs(self) -> Dict[str, Any]:
        """The case's canonical tensors (a fresh dict of fresh arrays on every call)."""
        return GENERATORS[self.generator](self.seed, **self.params)

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        return json.dumps(d, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> "Case":
        d = json.loads(text)
        return Case(**d)


# ---------------------------------------------------------------------------------------------
# KDA generators
# ---------------------------------------------------------------------------------------------

def _kda_base(seed: int, B: int = 1, T: int = 17, H: int = 2, HV: Optional[int] = None, d_k: int = 16,
              d_v: int = 16, state: bool = True) -> Dict[str, Any]:
    """kdalab.kda_inputs (the parity sweep's generator: bf16 raw tensors, L2-normalized q and k, the K3
    bounded gate with g_min = -5, sigmoid beta), with HV = 2H made by keeping the first H query/key
    heads of a 2H-head draw."""
    HV = H if HV is None else HV
    for name, v in (("B", B), ("T", T), ("H", H), ("HV", HV), ("d_k", d_k), ("d_v", d_v)):
        if v < 1:
            raise ValueError(f"{name} = {v}; accepted: {name} >= 1")
    if HV % H:
        raise ValueError(f"HV = {HV} must be a multiple of H = {H}")
    d = kdalab.kda_inputs(B, T, HV, d_k, d_v, seed=seed)
    x: Dict[str, Any] = {
        "op": "kda",
        "q": np.ascontiguousarray(d["q"][:, :, :H]), "k": np.ascontiguousarray(d["k"][:, :, :H]),
        "q_raw": np.ascontiguousarray(d["q_raw"][:, :, :H]), "k_raw": np.ascontiguousarray(d["k_raw"][:, :, :H]),
        "v": d["v"], "g": d["g"], "beta": d["beta"],
        "g_raw": d["g_raw"], "A_log": d["A_log"], "bias": d["bias"], "g_min": float(d["g_min"]),
        "beta_raw": d["beta_raw"],
        "S0": d["S0"] if state else None, "scale": float(d["scale"]), "cu_seqlens": None,
        "unit_qk": True,
    }
    return x


def random_kda(seed: int, **kw) -> Dict[str, Any]:
    """Plain random inputs of the parity sweep (kdalab.kda_inputs)."""
    return _kda_base(seed, **kw)


def _key_run(name: str, t0: int, reps: int, T: int) -> None:
    """The run of keys t0 .. t0 + reps - 1 must lie inside the T tokens (ValueError: the case cannot be generated)."""
    if not (0 <= t0 and 1 <= reps and t0 + reps <= T):
        raise ValueError(f"{name}: keys t0 = {t0} .. t0 + reps - 1 = {t0 + reps - 1} do not fit in T = {T} tokens; "
                         f"accepted: 0 <= t0, reps >= 1, t0 + reps <= T")


def repeated_keys(seed: int, t0: int = 3, reps: int = 4, **kw) -> Dict[str, Any]:
    """Key t0 repeated at positions t0 .. t0 + reps - 1 (inside one 16-token tile when t0 % 16 + reps <= 16):
    the strictly lower-triangular matrix of the UT transform gets equal rows."""
    x = _kda_base(seed, **kw)
    _key_run("repeated_keys", t0, reps, x["k"].shape[1])
    for name in ("k", "k_raw"):
        x[name][:, t0:t0 + reps] = x[name][:, t0:t0 + 1]
    return x


def collinear_keys(seed: int, t0: int = 3, reps: int = 4, eps: float = 2.0**-20, **kw) -> Dict[str, Any]:
    """Keys t0 .. t0 + reps - 1 near-collinear: key t0 plus eps times another drawn key, renormalized
    (q_raw and k_raw are set to the unit vectors, so an in-kernel L2Norm sees them too)."""
    x = _kda_base(seed, **kw)
    k = x["k"]
    _key_run("collinear_keys", t0, reps, k.shape[1])
    for j in range(1, reps):
        w = k[:, t0] + eps * k[:, t0 + j]
        k[:, t0 + j] = w / np.linalg.norm(w, axis=-1, keepdims=True)
    x["k_raw"] = k.copy()
    x["q_raw"] = x["q"].copy()
    return x


def key_norm(seed: int, log2_norm: int = 3, **kw) -> Dict[str, Any]:
    """q and k scaled by 2^log2_norm (tiny or huge norms) with L2Norm off: no logits are given, so a candidate
    that normalizes q and k in its kernel cannot run the case."""
    x = _kda_base(seed, **kw)
    s = 2.0 ** log2_norm
    x["q"] = x["q"] * s
    x["k"] = x["k"] * s
    for name in ("q_raw", "k_raw"):
        del x[name]
    x["unit_qk"] = False
    return x


def raw_qk_magnitude(seed: int, log2_scale: int = 60, **kw) -> Dict[str, Any]:
    """q_raw and k_raw scaled by 2^log2_scale (extreme bf16 magnitudes before an in-kernel L2Norm): the
    normalized q and k are unchanged, so the truth is the base case's."""
    x = _kda_base(seed, **kw)
    s = 2.0 ** log2_scale
    x["q_raw"] = x["q_raw"] * s
    x["k_raw"] = x["k_raw"] * s
    return x


def value_magnitude(seed: int, log2_scale: int = 100, **kw) -> Dict[str, Any]:
    """v (bf16 values) scaled by 2^log2_scale, exact in bf16: extreme value magnitudes."""
    x = _kda_base(seed, **kw)
    x["v"] = x["v"] * 2.0 ** log2_scale
    if x["S0"] is not None:
        x["S0"] = x["S0"] * 2.0 ** log2_scale
    return x


def value_outlier(seed: int, t0: int = 0, n: int = 1, log2_scale: int = 24, **kw) -> Dict[str, Any]:
    """v of the n tokens from t0 (every sequence and value head) scaled by 2^log2_scale, exact in bf16: an
    activation outlier the state must absorb and, once the gate has forgotten it, let go of."""
    x = _kda_base(seed, **kw)
    T = x["v"].shape[1]
    if not (0 <= t0 and n >= 1 and t0 + n <= T):
        raise ValueError(f"value_outlier: tokens {t0}..{t0 + n - 1} of T = {T}; accepted: 0 <= t0, n >= 1, t0 + n <= T")
    v = np.array(x["v"], copy=True)
    v[:, t0:t0 + n] *= 2.0 ** log2_scale
    x["v"] = v
    return x


def saturated_gate(seed: int, **kw) -> Dict[str, Any]:
    """Every gate at g_min = -5: A_log = 30 and g_raw + bias = 1, so Sigmoid(e^30) = 1 in float64 and fp32."""
    x = _kda_base(seed, **kw)
    x["g"] = np.full_like(x["g"], -5.0)
    x["g_raw"] = np.ones_like(x["g_raw"])
    x["bias"] = np.zeros_like(x["bias"])
    x["A_log"] = np.full_like(x["A_log"], 30.0)
    x["g_min"] = -5.0
    return x


def no_decay(seed: int, **kw) -> Dict[str, Any]:
    """g = 0 (no decay): A_log = 30 and g_raw + bias = -1, so Sigmoid(-e^30) = 0 in float64 and fp32."""
    x = _kda_base(seed, **kw)
    x["g"] = np.zeros_like(x["g"])
    x["g_raw"] = -np.ones_like(x["g_raw"])
    x["bias"] = np.zeros_like(x["bias"])
    x["A_log"] = np.full_like(x["A_log"], 30.0)
    return x


def beta_const(seed: int, value: float = 0.0, **kw) -> Dict[str, Any]:
    """beta = 0 (logit -800: Sigmoid underflows to exactly 0) or beta = 1 (logit 40: Sigmoid rounds to 1)."""
    if value not in (0.0, 1.0):
        raise ValueError(f"beta_const: value = {value}; accepted: 0 or 1")
    x = _kda_base(seed, **kw)
    x["beta"] = np.full_like(x["beta"], value)
    x["beta_raw"] = np.full_like(x["beta_raw"], -800.0 if value == 0.0 else 40.0)
    return x


def large_state(seed: int, log2_scale: int = 12, **kw) -> Dict[str, Any]:
    """The initial state S0 scaled by 2^log2_scale."""
    if not kw.get("state", True):
        raise ValueError("large_state: state = false leaves no initial state to scale; accepted: state = true")
    x = _kda_base(seed, **kw)
    x["S0"] = x["S0"] * 2.0 ** log2_scale
    return x


def long_memory(seed: int, g_min: float = -0.002, beta_logit: float = -4.125, **kw) -> Dict[str, Any]:
    """Slow decay and small writes: g = g_min / 2 everywhere (g_raw = bias = A_log = 0, exact) and
    beta = Sigmoid(beta_logit) everywhere (the bf16-exact logit -4.125 gives beta ~ 0.0159, about 2^-6), so kernels
    that take the gate and beta as logits run the case on the same inputs. A beta_logit that bf16 cannot hold is
    refused (ValueError): such a kernel would read it rounded, another beta than the oracle's."""
    f32 = np.float32(beta_logit)
    if float(f32) != beta_logit or int(f32.view(np.uint32)) & 0xFFFF:
        raise ValueError(f"long_memory: beta_logit = {beta_logit} is not exact in bf16 (a kernel that takes beta "
                         "logits reads them as bf16); accepted: a bf16 value, e.g. -4.125")
    x = _kda_base(seed, **kw)
    x["g"] = np.full_like(x["g"], g_min / 2)
    x["g_raw"] = np.zeros_like(x["g_raw"])
    x["bias"] = np.zeros_like(x["bias"])
    x["A_log"] = np.zeros_like(x["A_log"])
    x["g_min"] = g_min
    x["beta_raw"] = np.full_like(x["beta_raw"], beta_logit)
    x["beta"] = np.full_like(x["beta"], 1.0 / (1.0 + np.exp(-beta_logit)))
    return x


def unit_read(seed: int, **kw) -> Dict[str, Any]:
    """No decay, beta = 1, q_t = k_t (unit keys) and scale = 1: every read returns the value just written,
    o_t = v_t (docs/equations.md section 1, special cases)."""
    x = beta_const(seed, value=1.0, **kw)
    z = no_decay(seed, **kw)
    for name in ("g", "g_raw", "bias", "A_log"):
        x[name] = z[name]
    H, HV = x["q"].shape[2], x["v"].shape[2]
    if H != HV:
        raise ValueError("unit_read: HV must equal H")
    x["q"] = x["k"].copy()
    x["q_raw"] = x["k_raw"].copy()
    x["scale"] = 1.0
    return x


def varlen(seed: int, lens: List[int] = (1, 5, 17, 1), H: int = 2, HV: Optional[int] = None, d_k: int = 16,
           d_v: int = 16, state: bool = True) -> Dict[str, Any]:
    """Sequences of lengths `lens` packed along T (B = 1, cu_seqlens), each with its own S0 slot."""
    lens = [int(n) for n in lens]
    if any(n < 1 for n in lens):
        raise ValueError(f"varlen: lens = {lens}; every length must be >= 1")
    T = sum(lens)
    x = _kda_base(seed, B=1, T=T, H=H, HV=HV, d_k=d_k, d_v=d_v, state=False)
    N = len(lens)
    x["cu_seqlens"] = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    if state:
        s = _kda_base(seed + 1, B=N, T=1, H=H, HV=HV, d_k=d_k, d_v=d_v, state=True)
        x["S0"] = s["S0"]
    return x


def short_sequences(seed: int, n: int = 200, max_len: int = 5, **kw) -> Dict[str, Any]:
    """Hundreds of short sequences (lengths 1 .. max_len drawn with kdalab.Rng) packed in one varlen batch."""
    if n < 1 or max_len < 1:
        raise ValueError(f"short_sequences: n = {n}, max_len = {max_len}; accepted: n >= 1 sequences of 1 .. max_len "
                         f">= 1 tokens")
    u = kdalab.Rng(seed).uniform(n, 1.0, float(max_len) + 1.0)
    lens = [int(v) for v in np.floor(u)]
    return varlen(seed, lens=lens, **kw)


# ---------------------------------------------------------------------------------------------
# MLA decode generators
# ---------------------------------------------------------------------------------------------

def mla_decode_random(seed: int, B: int = 2, N: int = 33, n_h: int = 4, d_c: int = 32,
                      lens: Optional[List[int]] = None, log2_q: int = 0, s_q: int = 1) -> Dict[str, Any]:
    """Absorbed queries and a latent cache drawn N(0, 1) with kdalab.Rng; cache lengths `lens` (default: N for
    the first sequence, then shorter); q scaled by 2^log2_q (sharp or flat softmax). s_q > 1: multi-token decode
    (speculative decoding, multi-token prediction), q [B, s_q, n_h, d_c] (else [B, n_h, d_c]): the s_q queries of
    sequence b are its last s_q cached tokens, query j reading cache positions 0 .. lens[b] - s_q + j (causal among
    them), so every length is >= s_q."""
    if s_q < 1:
        raise ValueError(f"mla_decode_random: s_q = {s_q}; accepted: s_q >= 1 query tokens per sequence")
    for name, v in (("B", B), ("N", N), ("n_h", n_h), ("d_c", d_c)):
        if v < 1:
            raise ValueError(f"mla_decode_random: {name} = {v}; accepted: {name} >= 1")
    r = kdalab.Rng(seed)
    q = r.normal(B * s_q * n_h * d_c).reshape((B, n_h, d_c) if s_q == 1 else (B, s_q, n_h, d_c)) * 2.0 ** log2_q
    cache = r.normal(B * N * d_c).reshape(B, N, d_c)
    if lens is None:
        lens = [max(N - (b * 7) % N, s_q) for b in range(B)]
    lens = [int(n) for n in lens]
    if len(lens) != B or any(n < s_q or n > N for n in lens):
        raise ValueError(f"mla_decode_random: lens = {lens}; B = {B} lengths in [{s_q}, {N}] accepted (s_q = {s_q})")
    return {"op": "mla_decode", "q": q, "cache": cache, "cache_seqlens": np.array(lens, dtype=np.int64),
            "scale": 1.0 / np.sqrt(d_c)}


def mla_decode_repeated_rows(seed: int, **kw) -> Dict[str, Any]:
    """Every cached latent equal to the first (a uniform softmax): the output is that latent."""
    x = mla_decode_random(seed, **kw)
    x["cache"][:] = x["cache"][:, :1]
    return x


GENERATORS: Dict[str, Callable[..., Dict[str, Any]]] = {
    f.__name__: f for f in (
        random_kda, repeated_keys, collinear_keys, key_norm, raw_qk_magnitude, value_magnitude, value_outlier,
        saturated_gate,
        no_decay, beta_const, large_state, long_memory, unit_read, varlen, short_sequences,
        mla_decode_random, mla_decode_repeated_rows)
}


# ---------------------------------------------------------------------------------------------
# The catalogue
# ---------------------------------------------------------------------------------------------

T_SWEEP = (1, 15, 16, 17, 63, 64, 65, 127, 1000, 65536)


def _kda_catalogue() -> List[Case]:
    cs: List[Case] = []

    def add(name, gen, seed, params, prop="agreement", prop_params=None, about=""):
        T = params.get("T", 0)
        if "lens" in params:
            T = sum(params["lens"])
        if gen == "short_sequences":
            T = params.get("n", 200) * (params.get("max_len", 5) + 1) // 2
        cs.append(Case(name=name, op="kda", generator=gen, seed=seed, params=dict(params), prop=prop,
                       prop_params=dict(prop_params or {}), long=T >= LONG_T, about=about))

    # agreement with the oracle over the T sweep (B = 2 for T = 1: batched decode-sized calls)
    for T in T_SWEEP:
        add(f"agree/T{T}", "random_kda", 100 + T % 97, {"B": 2 if T == 1 else 1, "T": T},
            about="random inputs; T inside, at and past 16/64-token chunk edges")
    add("agree/hv2h", "random_kda", 11, {"T": 33, "H": 2, "HV": 4}, about="HV = 2H (grouped value heads)")
    add("agree/dv-ne-dk", "random_kda", 12, {"T": 21, "d_k": 16, "d_v": 8}, about="d_v != d_k")
    add("agree/no-state", "random_kda", 13, {"T": 19, "state": False}, about="no initial state (zero)")
    add("adv/repeated-keys", "repeated_keys", 21, {"T": 20, "t0": 2, "reps": 5},
        about="one key repeated 5 times inside a 16-token tile")
    add("adv/collinear-keys", "collinear_keys", 22, {"T": 20, "t0": 2, "reps": 5},
        about="near-collinear keys (cosine ~ 1 - 2^-41) inside one tile")
    add("adv/key-norm-tiny", "key_norm", 23, {"T": 20, "log2_norm": -10}, about="||q|| = ||k|| = 2^-10, L2Norm off")
    add("adv/key-norm-huge", "key_norm", 24, {"T": 20, "log2_norm": 2}, about="||q|| = ||k|| = 4, L2Norm off")
    add("adv/raw-qk-huge", "raw_qk_magnitude", 25, {"T": 20, "log2_scale": 66},
        about="q, k logits at 2^66 before an in-kernel L2Norm (squares overflow fp32)")
    add("adv/raw-qk-tiny", "raw_qk_magnitude", 26, {"T": 20, "log2_scale": -66},
        about="q, k logits at 2^-66 before an in-kernel L2Norm (squares underflow fp32)")
    add("adv/v-huge", "value_magnitude", 27, {"T": 20, "log2_scale": 100}, about="v and S0 at 2^100 (bf16 exact)")
    add("adv/v-tiny", "value_magnitude", 28, {"T": 20, "log2_scale": -100}, about="v and S0 at 2^-100 (bf16 exact)")
    add("adv/v-outlier-token", "value_outlier", 38, {"T": 200, "t0": 176, "n": 1, "log2_scale": 24},
        about="one token's v at 2^24 (t = 176 of 200, the chunk before the last)")
    add("adv/v-outlier-chunk", "value_outlier", 39, {"T": 200, "t0": 176, "n": 16, "log2_scale": 16},
        about="v of tokens 176..191 of 200 at 2^16 (a whole chunk before the last)")
    add("adv/gate-saturated", "saturated_gate", 29, {"T": 40}, about="g = g_min = -5 everywhere (A_log = 30)")
    add("adv/no-decay", "no_decay", 30, {"T": 40}, about="g = 0 everywhere")
    add("adv/beta-one", "beta_const", 32, {"T": 40, "value": 1.0}, about="beta = 1")
    add("adv/large-state", "large_state", 33, {"T": 20, "log2_scale": 12}, about="S0 scaled by 2^12")
    add("adv/long-memory", "long_memory", 34, {"T": 2000}, about="g = -0.001, beta = Sigmoid(-4.125) ~ 2^-6 over T = 2000")
    add("adv/varlen-short", "varlen", 35, {"lens": [1, 5, 17, 1, 16, 1]},
        about="varlen with 1-token sequences and a chunk-size one")
    add("adv/varlen-hundreds", "short_sequences", 36, {"n": 200, "max_len": 5},
        about="200 sequences of 1..5 tokens in one varlen batch")
    # special cases (docs/equations.md section 1)
    add("special/beta-zero", "beta_const", 31, {"T": 40, "value": 0.0},
        about="beta = 0: the state only decays (truth from the oracle)")
    add("special/unit-read", "unit_read", 37, {"T": 24}, prop="unit_read",
        about="no decay, beta = 1, q = k unit: o_t = v_t exactly (no oracle)")
    # exact properties
    for T, P in ((17, 5), (17, 16), (65, 16), (65, 64), (70, 66), (63, 62)):
        add(f"causal/T{T}-P{P}", "random_kda", 40 + T + P, {"T": T}, prop="causality", prop_params={"P": P},
            about="inputs at t >= P changed leave o[:P] bit-identical")
    add("batch/B3", "random_kda", 50, {"B": 3, "T": 37}, prop="batch_invariance",
        about="each sequence of a batch of 3 equals its own batch-of-1 call")
    add("varlen/pack", "varlen", 51, {"lens": [1, 5, 17, 1, 16, 1]}, prop="varlen_invariance",
        about="a packed varlen call equals one call per sequence")
    add("determinism/T65", "random_kda", 52, {"B": 2, "T": 65}, prop="determinism",
        about="two calls bit-identical")
    for T, split in ((64, 16), (80, 64), (70, 37), (33, 1)):
        add(f"continue/T{T}-at{split}", "random_kda", 53 + split, {"T": T}, prop="continuation",
            prop_params={"split": split}, about="one call == two calls passing the state")
    add("decode/B2-T20", "random_kda", 60, {"B": 2, "T": 20}, prop="decode_prefill",
        about="20 one-token calls passing the state == one prefill call")
    add("layout/state-roundtrip", "random_kda", 61, {"B": 2, "T": 1, "d_k": 16, "d_v": 16}, prop="state_layout",
        about="beta = 0, g = 0: S_T == S0 and o == scale S0^T q (a [K,V]/[V,K] mix-up shows)")
    # gradients: agreement is "not applicable" until the module has backward bindings (kdalab.verify.properties)
    add("grad/agree", "random_kda", 62, {"T": 20}, prop="gradient_agreement",
        about="gradients of <dO, o> against the gradient oracle")
    add("grad/agree-hv2h", "random_kda", 64, {"T": 19, "H": 1, "HV": 2}, prop="gradient_agreement",
        about="gradients with HV = 2H (dq, dk summed over a key head's value heads)")
    add("grad/causal", "random_kda", 63, {"T": 20}, prop="gradient_causality", prop_params={"P": 7},
        about="a loss on o[:, :7] has exactly zero gradient wrt inputs at t >= 7")
    # gradients on the adversarial inputs (the cheap backward precision plans fail on near-collinear keys:
    # docs/kernels/kda_backward.md, "Near-collinear and identical keys")
    add("grad/repeated-keys", "repeated_keys", 65, {"T": 20, "t0": 2, "reps": 5}, prop="gradient_agreement",
        about="gradients with one key repeated 5 times inside a 16-token tile")
    add("grad/collinear-keys", "collinear_keys", 66, {"T": 20, "t0": 2, "reps": 5}, prop="gradient_agreement",
        about="gradients with near-collinear keys (cosine ~ 1 - 2^-41) inside one tile")
    add("grad/no-decay", "no_decay", 67, {"T": 40}, prop="gradient_agreement",
        about="gradients with g = 0 everywhere (the state never forgets)")
    add("grad/long-memory", "long_memory", 68, {"T": 300}, prop="gradient_agreement",
        about="gradients with g = -0.001, beta ~ 2^-6 over T = 300")
    return cs


def _mla_catalogue() -> List[Case]:
    cs: List[Case] = []
    for name, params, about in (
            ("mla/agree", {}, "random latent cache and absorbed queries, B = 2 of different lengths"),
            ("mla/len1", {"B": 3, "N": 9, "lens": [1, 9, 2]}, "a cache of one token"),
            ("mla/sharp", {"log2_q": 3}, "queries at 8x: a sharp softmax"),
            ("mla/many-heads", {"n_h": 16, "B": 1, "N": 64}, "16 heads over 64 tokens")):
        cs.append(Case(name=name, op="mla_decode", generator="mla_decode_random", seed=70 + len(cs),
                       params=params, prop="agreement", about=about))
    cs.append(Case(name="mla/repeated-rows", op="mla_decode", generator="mla_decode_repeated_rows", seed=75,
                   params={}, prop="agreement", about="identical cached latents (uniform softmax)"))
    cs.append(Case(name="mla/batch", op="mla_decode", generator="mla_decode_random", seed=76,
                   params={"B": 3}, prop="batch_invariance", about="each sequence equals its batch-of-1 call"))
    cs.append(Case(name="mla/determinism", op="mla_decode", generator="mla_decode_random", seed=77,
                   params={"B": 2}, prop="determinism", about="two calls bit-identical"))
    # multi-token decode: s_q query tokens per sequence, causal among themselves
    for name, params, about in (
            ("mla/mtp2", {"s_q": 2}, "2 query tokens per sequence (speculative decoding), B = 2 of different lengths"),
            ("mla/mtp4", {"s_q": 4, "B": 3, "lens": [33, 9, 4]}, "4 query tokens; the last sequence holds only them"),
            ("mla/mtp4-sharp", {"s_q": 4, "log2_q": 3}, "4 query tokens, a sharp softmax: a token that reads a later "
                                                         "one shows")):
        cs.append(Case(name=name, op="mla_decode", generator="mla_decode_random", seed=78 + len(cs),
                       params=params, prop="agreement", about=about))
    cs.append(Case(name="mla/mtp-causal", op="mla_decode", generator="mla_decode_random", seed=89,
                   params={"B": 2, "s_q": 4}, prop="decode_causality", prop_params={"P": 2},
                   about="queries 2, 3 and the cache rows only they read replaced: o of queries 0, 1 bit-identical"))
    cs.append(Case(name="mla/mtp-batch", op="mla_decode", generator="mla_decode_random", seed=88,
                   params={"B": 3, "s_q": 3}, prop="batch_invariance", about="each sequence of 3 query tokens equals "
                                                                         "its batch-of-1 call"))
    return cs


def catalogue(op: str = "kda", *, long: bool = False) -> List[Case]:
    """The cases of one op ("kda" or "mla_decode"); long cases (T >= LONG_T) only when long is true."""
    if op == "kda":
        cs = _kda_catalogue()
    elif op == "mla_decode":
        cs = _mla_catalogue()
    else:
        raise ValueError(f"op = {op!r}; accepted: kda, mla_decode")
    return [c for c in cs if long or not c.long]


def _forwards_to(generator: str) -> Tuple[Callable[..., Dict[str, Any]], set]:
    """The generator that one taking **kw passes them to, and the parameters it sets there itself:
    short_sequences passes them to varlen (with its own lens), the MLA decode generators to mla_decode_random, the
    others to the base KDA generator."""
    if generator == "short_sequences":
        return varlen, {"lens"}
    return (mla_decode_random if generator.startswith("mla_decode") else _kda_base), set()


def accepted_params(generator: str) -> set:
    """The keyword parameters a generator accepts (when it takes **kw, also those of the generator it passes them
    to, _forwards_to)."""
    import inspect
    out = set()
    for p in inspect.signature(GENERATORS[generator]).parameters.values():
        if p.kind is p.VAR_KEYWORD:
            base, own = _forwards_to(generator)
            out |= {q for q in inspect.signature(base).parameters if q != "seed" and q not in own}
        elif p.name != "seed":
            out.add(p.name)
    return out


def _param_types(generator: str) -> Dict[str, str]:
    """The annotation (as text, e.g. "int", "Optional[List[int]]") of every keyword parameter of a generator."""
    import inspect
    out: Dict[str, str] = {}
    for g in (GENERATORS[generator], _forwards_to(generator)[0]):
        for p in inspect.signature(g).parameters.values():
            if p.kind is not p.VAR_KEYWORD and p.name != "seed":
                out.setdefault(p.name, str(p.annotation))
    return {k: v for k, v in out.items() if k in accepted_params(generator)}


def _fits(value: Any, annotation: str) -> bool:
    """Whether a --param value (read as JSON) has the type a generator parameter is annotated with."""
    if annotation.startswith("Optional["):
        return value is None or _fits(value, annotation[len("Optional["):-1])
    if annotation == "bool":
        return isinstance(value, bool)
    if annotation == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation == "List[int]":
        return isinstance(value, list) and all(_fits(x, "int") for x in value)
    return True


def check_params(cs: List[Case], params: Dict[str, Any]) -> None:
    """ValueError naming the --param when no case of `cs` has a generator taking it (it would change nothing) or
    when its value does not have the parameter's type (e.g. d_k=abc, T=1e3: the generator would raise a TypeError
    inside the run)."""
    for key, value in params.items():
        types = {}
        for c in cs:
            types.update(_param_types(c.generator))
        if key not in types:
            accepted = sorted(set().union(*(accepted_params(c.generator) for c in cs))) if cs else []
            raise ValueError(f"--param {key}={json.dumps(value)}: no selected case's generator takes {key!r}; "
                             f"accepted: {', '.join(accepted)}")
        if not _fits(value, types[key]):
            example = ("[16,9]" if "List" in types[key] else "true" if "bool" in types[key]
                       else "0.5" if "float" in types[key] else "16")
            raise ValueError(f"--param {key}={json.dumps(value)}: {key} is {types[key]}; give a value of that type "
                             f"(e.g. {key}={example})")


def with_params(cs: List[Case], params: Dict[str, Any]) -> List[Case]:
    """The cases with `params` overriding the generator parameters each generator accepts (e.g. d_k = 128)."""
    out = []
    for c in cs:
        p = dict(c.params)
        p.update({k: v for k, v in params.items() if k in accepted_params(c.generator)})
        out.append(dataclasses.replace(c, params=p))
    return out


def find(name: str, op: Optional[str] = None) -> Case:
    """The catalogue case called `name` (long cases included); KeyError naming it when there is none."""
    for o in ([op] if op else ["kda", "mla_decode"]):
        for c in catalogue(o, long=True):
            if c.name == name:
                return c
    raise KeyError(name)
