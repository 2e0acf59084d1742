"""The error budget of a candidate's output, in one place so the rule can be swapped.

The intended rule (docs/verify.md, "Budgets"): budget = F * (the error of a reference emulation at the
candidate's declared precision + the rounding of its output format), computed in C++. Until that rule is
bound into Python, `budget()` below is a placeholder: a fixed relative-RMS budget per declared precision,
taken from numerics/tolerance.hpp through kdalab.budgets() (each with its reason). Replace the body of
`budget()` and nothing else changes.

The metric is kdalab.check (numerics/metrics.hpp): relative RMS error, max |error|, bf16 ulps, NaN/Inf
counts, all computed in C++.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict

import kdalab

# Declared precision -> the budget of numerics/tolerance.hpp used by the placeholder rule, per op.
_PLACEHOLDER = {
    ("kda", "float64"): "f64_identity",
    ("kda", "float32"): "f32_vs_truth",
    ("kda", "bf16"): "kda_bf16_goal",
    ("mla_decode", "float64"): "f64_identity",
    ("mla_decode", "float32"): "f32_vs_truth",
    ("mla_decode", "bf16"): "mla_decode_goal",
}

PRECISIONS = ("float64", "float32", "bf16")


@dataclasses.dataclass(frozen=True)
class Budget:
    tol: float        # relative RMS error allowed
    rule: str         # which rule gave it
    reason: str       # why this value


def budget(op: str, precision: str, quantity: str, case_inputs: Dict[str, Any]) -> Budget:
    """The budget of one output (`quantity`: "o" or "S") of a candidate declaring `precision` on a case.
    Placeholder rule: the per-precision budget of numerics/tolerance.hpp (case_inputs unused until the
    emulation-based rule is bound)."""
    key = (op, precision)
    if key not in _PLACEHOLDER:
        raise ValueError(f"precision = {precision!r}; accepted: {', '.join(PRECISIONS)}")
    name = _PLACEHOLDER[key]
    tol, why = kdalab.budgets()[name]
    return Budget(tol=float(tol), rule=f"placeholder:{name}", reason=why)


def measure(x, truth, name: str, b: Budget):
    """kdalab.check of x against truth with budget b (a kdalab.CheckResult)."""
    return kdalab.check(x, truth, name=name, tol=b.tol)
