"""The error budget of a candidate's output, in one place: the budget rule of `kdalab check`, computed in C++.

budget = max(F * (relRMS of the plain reference emulation at the candidate's declared precision vs the truth
+ relRMS of rounding the truth to the quantity's output format), floor), F = kdalab.BUDGET_FACTOR (2),
floor = kdalab.BUDGET_FLOOR (numerics/budget.hpp; docs/check-format.md, "The budget rule"; docs/verify.md,
"Budgets"). It depends on the case's inputs, the declared precision and the output format only, never on the
candidate. The emulation gets the inputs in the form the adapter hands them to the candidate (the log-decay g or
the gate logits, beta or its logits, q and k or their raw values before an in-kernel L2Norm: Adapter.fused_gate,
beta_logits, l2norm_qk); the output formats are the adapter's (Adapter.output_formats). Here only the choice of
those arguments: the emulation, the truth and the rule are kdalab.budget_kda / kdalab.budget_mla.

The metric is kdalab.check (numerics/metrics.hpp): relative RMS error, max |error|, bf16 ulps, NaN/Inf
counts, all computed in C++.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
from typing import Any, Dict, Optional

import numpy as np

import kdalab

PRECISIONS = ("float64", "float32", "bf16")


@dataclasses.dataclass(frozen=True)
class Budget:
    tol: float                  # relative RMS error allowed
    rule: str                   # which rule gave it, short (e.g. "rule:F=2 emulation bf16, output bf16")
    reason: str                 # the rule in words
    emulation: float = float("nan")        # relRMS of the emulation at the declared precision vs the truth
    output_rounding: float = float("nan")  # relRMS of the truth rounded to the output format


# The last few cases' budgets: every quantity of a case comes from one emulation, and a property compares a case's
# quantities one at a time (and some properties several times on one case).
_CACHE: "collections.OrderedDict[bytes, Dict[str, Any]]" = collections.OrderedDict()
_CACHE_SIZE = 8


def _key(*parts) -> bytes:
    h = hashlib.sha1()
    for p in parts:
        if isinstance(p, np.ndarray):
            h.update(repr((p.dtype.str, p.shape)).encode())
            h.update(np.ascontiguousarray(p).tobytes())
        else:
            h.update(repr(p).encode())
        h.update(b"|")
    return h.digest()


def _kda_form(x: Dict[str, Any], adapter, gradients: bool) -> Dict[str, Any]:
    """The inputs of the case as the adapter hands them to the candidate (gradients: always the canonical form,
    the one the gradient oracle and the backward convention use)."""
    fused = not gradients and getattr(adapter, "fused_gate", False) and all(n in x for n in ("g_raw", "A_log", "bias"))
    logits = not gradients and getattr(adapter, "beta_logits", False) and "beta_raw" in x
    l2 = not gradients and getattr(adapter, "l2norm_qk", False) and "q_raw" in x and "k_raw" in x
    kw: Dict[str, Any] = dict(q=x["q_raw"] if l2 else x["q"], k=x["k_raw"] if l2 else x["k"], v=x["v"],
                              g=x["g_raw"] if fused else x["g"], beta=x["beta_raw"] if logits else x["beta"],
                              S0=x["S0"], l2norm_qk=bool(l2), beta_logits=bool(logits))
    if fused:
        kw.update(gate="k3", A_log=x["A_log"], bias=x["bias"], g_min=float(x["g_min"]))
    return {k: np.ascontiguousarray(v, dtype=np.float64) if isinstance(v, np.ndarray) else v for k, v in kw.items()}


def budgets_of_case(op: str, precision: str, x: Dict[str, Any], adapter=None,
                    dO: Optional[np.ndarray] = None) -> Dict[str, Any]:
    """Every quantity's kdalab.Budget of a case for a candidate declaring `precision` through `adapter` (None: the
    canonical form, every quantity stored at the declared precision); with dO (KDA) the gradients' too."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision = {precision!r}; accepted: {', '.join(PRECISIONS)}")
    formats = getattr(adapter, "output_formats", None)
    if formats is not None and dO is None:  # gradient formats (d...) only where gradients are budgeted
        formats = {k: v for k, v in formats.items() if not k.startswith("d")}
    if op == "kda":
        kw = _kda_form(x, adapter, dO is not None)
        cu = x.get("cu_seqlens")
        key = _key(op, precision, formats, sorted((k, v) for k, v in kw.items() if not isinstance(v, np.ndarray)),
                   *[kw[k] for k in ("q", "k", "v", "g", "beta") + (("A_log", "bias") if "A_log" in kw else ())],
                   kw["S0"] if kw["S0"] is not None else "no S0", x["scale"], cu if cu is not None else "no cu",
                   dO if dO is not None else "no dO")
        if key not in _CACHE:
            _CACHE[key] = kdalab.budget_kda(
                kw.pop("q"), kw.pop("k"), kw.pop("v"), kw.pop("g"), kw.pop("beta"), kw.pop("S0"), scale=x["scale"],
                precision=precision, output_format=formats,
                cu_seqlens=None if cu is None else [int(c) for c in cu], dO=dO, **kw)
    elif op == "mla_decode":
        q = np.ascontiguousarray(x["q"] if x["q"].ndim == 4 else x["q"][:, None], dtype=np.float64)
        key = _key(op, precision, formats, q, x["cache"], x["cache_seqlens"], x["scale"])
        if key not in _CACHE:
            _CACHE[key] = kdalab.budget_mla(q, np.ascontiguousarray(x["cache"], dtype=np.float64), scale=x["scale"],
                                            precision=precision, output_format=formats,
                                            lens=[int(n) for n in x["cache_seqlens"]])
    else:
        raise ValueError(f"op = {op!r}; accepted: kda, mla_decode")
    _CACHE.move_to_end(key)
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return _CACHE[key]


def budget(op: str, precision: str, quantity: str, case_inputs: Dict[str, Any], adapter=None,
           dO: Optional[np.ndarray] = None) -> Budget:
    """The budget of one output (`quantity`: "o", "S", or with dO a gradient "dq", "dk", "dv", "dg", "dbeta", "dS0")
    of a candidate declaring `precision` on a case, by the rule of `kdalab check` (module docstring)."""
    b = budgets_of_case(op, precision, case_inputs, adapter, dO)
    if quantity not in b:
        raise ValueError(f"quantity = {quantity!r} has no budget for op {op}; accepted: {', '.join(b)}")
    r = b[quantity]
    if not np.isfinite(r.value):  # the emulation overflowed: the rule gives no budget (as `kdalab check`)
        raise kdalab.Error(f"the budget of {quantity} is not finite: the emulation at {r.precision} overflows on "
                           f"these inputs (relRMS {r.emulation})")
    return Budget(tol=float(r.value), rule=r.label, reason=r.rule, emulation=float(r.emulation),
                  output_rounding=float(r.output_rounding))


def measure(x, truth, name: str, b: Budget):
    """kdalab.check of x against truth with budget b (a kdalab.CheckResult)."""
    return kdalab.check(x, truth, name=name, tol=b.tol)
