"""`kdalab verify`: kdalab's oracle drives someone else's kernel through adversarial and metamorphic cases.

    python -m kdalab.verify --op kda --candidate MODULE:FUNCTION --adapter NAME      (or `kdalab-verify ...`)
    kdalab.verify.run(candidate, op="kda", cases=["causal/*"], adapter="fla-chunk:gate=fused")

Pure Python over the C++ oracle (kdalab._core): the truth, the metrics and the report writer are kdalab's.
Cases: kdalab.verify.cases; properties and verdicts: kdalab.verify.properties; adapters (calling
conventions): kdalab.verify.adapters; budgets: kdalab.verify.budgets. Documentation: docs/verify.md.
"""
from .adapters import ADAPTERS, Adapter, make_adapter
from .budgets import Budget, budget
from .cases import GENERATORS, Case, catalogue
from .properties import BROKEN, NA, OVER, PROPERTIES, WITHIN, Result, check_case
from .runner import Report, replay, run, write_report

__all__ = ["ADAPTERS", "Adapter", "BROKEN", "Budget", "Case", "GENERATORS", "NA", "OVER", "PROPERTIES", "Report",
           "Result", "WITHIN", "budget", "catalogue", "check_case", "make_adapter", "replay", "run", "write_report"]
