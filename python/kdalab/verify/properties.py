"""The properties `kdalab verify` checks, one function each: (adapter, case, inputs, options) -> Result.

Verdicts (docs/verify.md, "Verdicts"):
  "within the noise of its precision"  every compared output within its budget (kdalab.verify.budgets)
  "over budget by X"                   the worst output's relative RMS error is X times its budget
  "property broken"                    an exact property failed, or an output holds NaN/Inf, or the candidate raised
  "not applicable"                     the adapter cannot run the case (the reason is reported); never a pass
Exact properties (bit-identical): causality, batch and varlen packing invariance (where the adapter declares a
batch-independent reduction order; else within budget, the spread reported), determinism. Within budget: agreement
with the oracle, chunked continuation, decode == prefill, state-layout round trip, the special cases.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

import kdalab

from . import budgets as budget_mod
from . import oracle
from .cases import GENERATORS, Case

WITHIN = "within the noise of its precision"
OVER = "over budget"
BROKEN = "property broken"
NA = "not applicable"

# Per-token tensors of a KDA case (axis 1 is T) and per-sequence ones of an MLA decode case (axis 0 is B).
TOKEN_KEYS = ("q", "k", "v", "g", "beta", "q_raw", "k_raw", "g_raw", "beta_raw")
MLA_KEYS = ("q", "cache", "cache_seqlens")


@dataclasses.dataclass
class Result:
    case: str
    prop: str
    verdict: str              # WITHIN, "over budget by X", BROKEN or NA
    passed: bool
    rel_rms: float = float("nan")   # the worst compared output's relative RMS error (nan: none compared)
    tol: float = float("nan")       # its budget
    detail: str = ""

    @property
    def kind(self) -> str:
        """WITHIN, OVER, BROKEN or NA."""
        return OVER if self.verdict.startswith(OVER) else self.verdict


class Broken(Exception):
    """An exact property failed or an output is not finite (the message says which and where)."""


def _finite(name: str, a: Optional[np.ndarray]) -> None:
    if a is not None and not np.all(np.isfinite(a)):
        raise Broken(f"{name} holds {int(np.isnan(a).sum())} NaN and {int(np.isinf(a).sum())} Inf "
                     f"(first at index {tuple(int(i) for i in np.argwhere(~np.isfinite(a))[0])})")


def _call(adapter, x) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    try:
        o, S = adapter(x)
    except Broken:
        raise
    except (Exception, SystemExit) as e:  # the candidate's own failure is a finding, reported with its type; a
        # SystemExit (sys.exit() inside the candidate) would otherwise end kdalab-verify with the candidate's code
        raise Broken(f"the candidate raised {type(e).__name__}: {e}") from e
    _finite("o", o)
    _finite("S", S)
    return o, S


class _Compare:
    """Collects budgeted comparisons; the worst ratio decides the verdict."""

    def __init__(self, adapter, x, dO: Optional[np.ndarray] = None):
        self.adapter, self.x, self.dO = adapter, x, dO  # dO: the upstream gradient of gradient comparisons
        self.worst: Tuple[float, float, float] = (-1.0, float("nan"), float("nan"))  # ratio, rel_rms, tol
        self.lines: List[str] = []

    def add(self, name: str, got: np.ndarray, want: np.ndarray) -> None:
        if got.shape != want.shape:
            raise Broken(f"{name} has shape {got.shape}, expected {want.shape}")
        b = budget_mod.budget(self.adapter.op, self.adapter.precision, name, self.x, self.adapter, self.dO)
        c = budget_mod.measure(got, want, name, b)
        ratio = c.rel_rms / b.tol if b.tol > 0 else float("inf")
        self.lines.append(f"{name}: rel_rms {c.rel_rms:.3e}, max_abs {c.max_abs:.3e} (budget {b.tol:.2e} from "
                          f"emulation {b.emulation:.2e} + output rounding {b.output_rounding:.2e}, {b.rule})")
        if ratio > self.worst[0]:
            self.worst = (ratio, c.rel_rms, b.tol)

    def result(self, case: Case, prop: str, note: str = "") -> Result:
        ratio, rel, tol = self.worst
        detail = "; ".join(self.lines + ([note] if note else []))
        if ratio <= 1.0:
            return Result(case.name, prop, WITHIN, True, rel, tol, detail)
        return Result(case.name, prop, f"{OVER} by {ratio:.3g}x", False, rel, tol, detail)


def slice_t(x: Dict[str, Any], a: int, b: int, S0=None) -> Dict[str, Any]:
    """Tokens a .. b-1 of a KDA case (B > 1 allowed, no varlen), starting from state S0."""
    y = dict(x)
    for k in TOKEN_KEYS:
        if k in x:
            y[k] = np.ascontiguousarray(x[k][:, a:b])
    y["S0"] = S0 if a > 0 else x["S0"]
    return y


def slice_b(x: Dict[str, Any], b: int) -> Dict[str, Any]:
    """Sequence b of a batched case, as a batch of one."""
    y = dict(x)
    keys = TOKEN_KEYS if x["op"] == "kda" else MLA_KEYS
    for k in keys:
        if k in x:
            y[k] = np.ascontiguousarray(x[k][b:b + 1])
    if x["op"] == "kda" and x["S0"] is not None:
        y["S0"] = np.ascontiguousarray(x["S0"][b:b + 1])
    return y


def slice_seq(x: Dict[str, Any], n: int) -> Dict[str, Any]:
    """Sequence n of a varlen case, as a batch of one without cu_seqlens."""
    a, b = int(x["cu_seqlens"][n]), int(x["cu_seqlens"][n + 1])
    y = slice_t(x, a, b, None)
    y["S0"] = None if x["S0"] is None else np.ascontiguousarray(x["S0"][n:n + 1])
    y["cu_seqlens"] = None
    return y


def _bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def _spread(a: np.ndarray, b: np.ndarray) -> str:
    d = np.abs(a - b)
    return f"not bit-identical: {int(np.count_nonzero(d))} of {d.size} elements differ, max |diff| {d.max():.3e}"


# ---------------------------------------------------------------------------------------------
# Within budget
# ---------------------------------------------------------------------------------------------

def agreement(adapter, case: Case, x, opts) -> Result:
    """Output (and final state) against the oracle, within budget."""
    o, S = _call(adapter, x)
    to, tS = oracle.truth(x, opts.get("truth", "float64"))
    c = _Compare(adapter, x)
    c.add("o", o, to)
    if S is not None and tS is not None:
        c.add("S", S, tS)
    return c.result(case, "agreement")


def unit_read(adapter, case: Case, x, opts) -> Result:
    """No decay, beta = 1, q_t = k_t unit, scale = 1: o_t equals the value just written, v_t (no oracle)."""
    o, _ = _call(adapter, x)
    c = _Compare(adapter, x)
    c.add("o", o, x["v"])
    return c.result(case, "unit_read")


def continuation(adapter, case: Case, x, opts) -> Result:
    """One call == two calls split at `split`, the second starting from the first's final state."""
    if not adapter.returns_state:
        return Result(case.name, "continuation", NA, False, detail="the candidate returns no final state")
    split = case.prop_params["split"]
    T = x["q"].shape[1]
    o, S = _call(adapter, x)
    o1, S1 = _call(adapter, slice_t(x, 0, split))
    o2, S2 = _call(adapter, slice_t(x, split, T, S1))
    c = _Compare(adapter, x)
    c.add("o", np.concatenate([o1, o2], axis=1), o)
    c.add("S", S2, S)
    return c.result(case, "continuation", f"split at {split} of {T}")


def decode_prefill(adapter, case: Case, x, opts) -> Result:
    """T one-token calls, each from the previous final state == one prefill call."""
    if not adapter.returns_state:
        return Result(case.name, "decode_prefill", NA, False, detail="the candidate returns no final state")
    T = x["q"].shape[1]
    o, S = _call(adapter, x)
    outs, St = [], x["S0"]
    for t in range(T):
        y = slice_t(x, t, t + 1, St)
        if t == 0:
            y["S0"] = x["S0"]
        ot, St = _call(adapter, y)
        outs.append(ot)
    c = _Compare(adapter, x)
    c.add("o", np.concatenate(outs, axis=1), o)
    c.add("S", St, S)
    return c.result(case, "decode_prefill", f"{T} one-token calls")


def state_layout(adapter, case: Case, x, opts) -> Result:
    """beta = 0 and g = 0 on every token: the state passes through unchanged (S_T == S0) and o reads S0
    (o == scale S0^T q, from the oracle); a [K,V] state read as [V,K] fails both."""
    if x["S0"] is None:
        return Result(case.name, "state_layout", NA, False,
                      detail="the case needs an initial state to pass through (state = false removes it)")
    y = dict(x)
    y["beta"] = np.zeros_like(x["beta"])
    y["g"] = np.zeros_like(x["g"])
    if "beta_raw" in x:
        y["beta_raw"] = np.full_like(x["beta_raw"], -800.0)
    if "g_raw" in x:
        y["g_raw"] = -np.ones_like(x["g_raw"])
        y["bias"] = np.zeros_like(x["bias"])
        y["A_log"] = np.full_like(x["A_log"], 30.0)
    reason = adapter.supports(y)
    if reason:
        return Result(case.name, "state_layout", NA, False, detail=reason)
    if not adapter.returns_state:
        return Result(case.name, "state_layout", NA, False, detail="the candidate returns no final state")
    o, S = _call(adapter, y)
    to, _ = oracle.truth(y, opts.get("truth", "float64"))
    c = _Compare(adapter, y)
    c.add("o", o, to)
    c.add("S", S, y["S0"])
    return c.result(case, "state_layout")


# ---------------------------------------------------------------------------------------------
# Exact
# ---------------------------------------------------------------------------------------------

def _prefix_unchanged(adapter, case: Case, prop: str, x, y, P: int, changed: str, at: str) -> Result:
    """The exact check of the causality properties: o[:, :P] of x and of y (x with `changed` replaced) bit-identical;
    `at` names axis 1 of o in the message ("t", "query")."""
    o1, _ = _call(adapter, x)
    o2, _ = _call(adapter, y)
    if not _bits_equal(o1[:, :P], o2[:, :P]):
        d = np.abs(o1[:, :P] - o2[:, :P])
        first = int(np.argwhere(d > 0)[0][1])
        raise Broken(f"o[:, :{P}] changed when {changed} changed (first at {at} = {first}, max |diff| {d.max():.3e})")
    return Result(case.name, prop, WITHIN, True, 0.0, 0.0, f"o[:, :{P}] bit-identical")


def causality(adapter, case: Case, x, opts) -> Result:
    """Inputs at positions >= P replaced by another draw leave o[:, :P] bit-identical."""
    P = case.prop_params["P"]
    other = GENERATORS[case.generator](case.seed + 7919, **case.params)
    y = dict(x)
    for k in TOKEN_KEYS:
        if k in x and k in other:
            y[k] = x[k].copy()
            y[k][:, P:] = other[k][:, P:]
    return _prefix_unchanged(adapter, case, "causality", x, y, P, f"inputs at t >= {P}", "t")


def decode_causality(adapter, case: Case, x, opts) -> Result:
    """Multi-token decode (q [B, s_q, n_h, d_c]; query j of sequence b reads cache positions <= L_b - s_q + j): the
    queries from P on and every cache row queries 0 .. P - 1 cannot read (positions >= L_b - s_q + P, those past L_b
    too) replaced by another draw leave o[:, :P] bit-identical."""
    P = case.prop_params["P"]
    s_q = x["q"].shape[1]
    other = GENERATORS[case.generator](case.seed + 7919, **case.params)
    y = dict(x)
    y["q"] = x["q"].copy()
    y["q"][:, P:] = other["q"][:, P:]
    y["cache"] = x["cache"].copy()
    for b, L in enumerate(x["cache_seqlens"]):
        first = int(L) - s_q + P  # the first position query P - 1 cannot read
        y["cache"][b, first:] = other["cache"][b, first:]
    return _prefix_unchanged(adapter, case, "decode_causality", x, y, P,
                             "the later queries and the cache rows they alone read", "query")


def _invariance(adapter, case: Case, prop: str, whole: np.ndarray, parts: List[np.ndarray], x) -> Result:
    joined = np.concatenate(parts, axis=0 if x["op"] == "mla_decode" or x.get("cu_seqlens") is None else 1)
    if _bits_equal(joined, whole):
        return Result(case.name, prop, WITHIN, True, 0.0, 0.0, "bit-identical")
    if adapter.exact_batch:
        raise Broken(f"the candidate declares a batch-independent reduction order; {_spread(joined, whole)}")
    c = _Compare(adapter, x)
    c.add("o", joined, whole)
    return c.result(case, prop, _spread(joined, whole))


def batch_invariance(adapter, case: Case, x, opts) -> Result:
    """Each sequence of a batch equals its own batch-of-one call."""
    o, _ = _call(adapter, x)
    parts = [_call(adapter, slice_b(x, b))[0] for b in range(x["q"].shape[0])]
    return _invariance(adapter, case, "batch_invariance", o, parts, x)


def varlen_invariance(adapter, case: Case, x, opts) -> Result:
    """A packed varlen call equals one call per sequence (outputs and final states)."""
    o, S = _call(adapter, x)
    outs, states = [], []
    for n in range(len(x["cu_seqlens"]) - 1):
        on, sn = _call(adapter, slice_seq(x, n))
        outs.append(on)
        states.append(sn)
    r = _invariance(adapter, case, "varlen_invariance", o, outs, x)
    if S is not None and states[0] is not None:
        Sj = np.concatenate(states, axis=0)
        if not _bits_equal(Sj, S):
            if adapter.exact_batch:
                raise Broken(f"final states: {_spread(Sj, S)}")
            r2 = _Compare(adapter, x)
            r2.add("S", Sj, S)
            rs = r2.result(case, "varlen_invariance", "final states " + _spread(Sj, S))
            if not rs.passed:
                return rs
    return r


def determinism(adapter, case: Case, x, opts) -> Result:
    """Two calls on the same inputs are bit-identical (else the spread is reported, within budget)."""
    o1, S1 = _call(adapter, x)
    o2, S2 = _call(adapter, x)
    same = _bits_equal(o1, o2) and (S1 is None or _bits_equal(S1, S2))
    if same:
        return Result(case.name, "determinism", WITHIN, True, 0.0, 0.0, "bit-identical")
    if getattr(adapter, "deterministic", True):
        raise Broken(f"two calls differ: {_spread(o1, o2)}")
    c = _Compare(adapter, x)
    c.add("o", o2, o1)
    return c.result(case, "determinism", _spread(o1, o2))


# ---------------------------------------------------------------------------------------------
# Gradients
# ---------------------------------------------------------------------------------------------

GRADS = (("dq", "q"), ("dk", "k"), ("dv", "v"), ("dg", "g"), ("dbeta", "beta"))


def _grad_call(adapter, x, dO) -> Dict[str, np.ndarray]:
    try:
        d = adapter.backward(x, dO)
    except (Exception, SystemExit) as e:  # SystemExit: as in _call
        raise Broken(f"the candidate's backward raised {type(e).__name__}: {e}") from e
    for name, arr in d.items():
        _finite(name, arr)
    return d


def _grad_reason(adapter, x) -> Optional[str]:
    if not hasattr(adapter, "backward"):
        return f"the adapter {adapter.name} has no backward convention"
    r = adapter.backward_reason(x) if hasattr(adapter, "backward_reason") else None
    if r:
        return r
    if x.get("cu_seqlens") is not None:
        return "gradient cases are not varlen"
    return None


def _upstream(case: Case, x) -> np.ndarray:
    """dO = dL/do drawn with kdalab.Rng from the case's seed (N(0, 1))."""
    shape = x["v"].shape
    return kdalab.Rng(case.seed + 104729).normal(int(np.prod(shape))).reshape(shape)


def gradient_agreement(adapter, case: Case, x, opts) -> Result:
    """Gradients of L = <dO, o> with respect to q, k, v, g, beta (and S0) against the gradient oracle
    kdalab.kda_recurrent_backward (reference/kda_backward.hpp), within budget."""
    r = _grad_reason(adapter, x)
    if r:
        return Result(case.name, "gradient_agreement", NA, False, detail=r)
    if not hasattr(kdalab, "kda_recurrent_backward"):
        return Result(case.name, "gradient_agreement", NA, False,
                      detail="this kdalab has no backward bindings (kdalab.kda_recurrent_backward)")
    dO = _upstream(case, x)
    got = _grad_call(adapter, x, dO)
    want = kdalab.kda_recurrent_backward(x["q"], x["k"], x["v"], x["g"], x["beta"], x["S0"], dO, scale=x["scale"],
                                         precision=opts.get("truth", "float64"))
    c = _Compare(adapter, x, dO)
    for name, _ in GRADS + ((("dS0", "S0"),) if x["S0"] is not None else ()):
        if name in got:
            c.add(name, got[name], want[name])
    return c.result(case, "gradient_agreement")


def gradient_causality(adapter, case: Case, x, opts) -> Result:
    """A loss on o[:, :P] only (dO = 0 at t >= P) has exactly zero gradient with respect to every input at t >= P
    (no oracle needed)."""
    r = _grad_reason(adapter, x)
    if r:
        return Result(case.name, "gradient_causality", NA, False, detail=r)
    P = case.prop_params["P"]
    dO = _upstream(case, x)
    dO[:, P:] = 0.0
    got = _grad_call(adapter, x, dO)
    for name, _ in GRADS:
        if name in got and np.any(got[name][:, P:] != 0):
            t = int(np.argwhere(got[name][:, P:] != 0)[0][1]) + P
            raise Broken(f"{name} is nonzero at t = {t} >= {P} for a loss on o[:, :{P}]")
    return Result(case.name, "gradient_causality", WITHIN, True, 0.0, 0.0,
                  f"d(q, k, v, g, beta)[:, {P}:] exactly zero")


PROPERTIES: Dict[str, Callable[..., Result]] = {
    f.__name__: f for f in (agreement, unit_read, continuation, decode_prefill, state_layout, causality,
                            decode_causality, batch_invariance, varlen_invariance, determinism, gradient_agreement,
                            gradient_causality)
}

EXACT = ("causality", "decode_causality", "batch_invariance", "varlen_invariance", "determinism")


def check_case(adapter, case: Case, opts: Optional[Dict[str, Any]] = None) -> Result:
    """Runs one case's property on the adapter; never raises for a candidate's failure."""
    opts = opts or {}
    try:
        x = case.inputs()
    except ValueError as e:  # parameters the generator refuses (e.g. an override that does not fit the case)
        return Result(case.name, case.prop, NA, False, detail=f"the case cannot be generated: {e}")
    except (ArithmeticError, TypeError, IndexError) as e:  # an override the generator cannot take (2.0**2000 ...)
        return Result(case.name, case.prop, NA, False,
                      detail=f"the case cannot be generated with parameters {case.params}: {type(e).__name__}: {e}")
    except MemoryError:  # sizes too large for this machine (e.g. --param T=10**12): nothing can be checked
        return Result(case.name, case.prop, NA, False,
                      detail=f"the case's inputs do not fit in memory (parameters {case.params})")
    bad = [k for k, v in x.items() if isinstance(v, np.ndarray) and v.dtype.kind == "f" and not np.all(np.isfinite(v))]
    if bad:  # a parameter override that makes NaN or Inf inputs (eps=NaN, g_min=NaN): no candidate is to blame
        return Result(case.name, case.prop, NA, False,
                      detail=f"the case's inputs hold NaN or Inf ({', '.join(bad)}) with parameters {case.params}")
    reason = adapter.supports(x)
    if reason:
        return Result(case.name, case.prop, NA, False, detail=reason)
    if case.prop in ("varlen_invariance",) and x.get("cu_seqlens") is None:
        return Result(case.name, case.prop, NA, False, detail="the case is not varlen")
    try:
        return PROPERTIES[case.prop](adapter, case, x, opts)
    except Broken as e:
        return Result(case.name, case.prop, BROKEN, False, detail=str(e))
    except kdalab.Error as e:  # the oracle or the budget rule refused the case's inputs: nothing was checked
        return Result(case.name, case.prop, NA, False,
                      detail=f"the oracle or the budget rule cannot judge the case: {e}")
    except MemoryError:  # the oracle's or the candidate's work for these sizes does not fit in memory
        return Result(case.name, case.prop, NA, False,
                      detail=f"the case does not fit in memory (parameters {case.params})")
