"""pytest utilities over `kdalab verify`: parametrize a test over the case catalogue and assert that a candidate
passes a case, with a failure message naming the case, its seed and its generator call (docs/verify.md).

    from kdalab.testing import parametrize_cases, assert_case_passes

    @parametrize_cases("kda")
    def test_my_kernel(case):
        assert_case_passes(my_kernel, case, adapter="fla-chunk:gate=fused")

A case the adapter cannot run is skipped with the adapter's reason (never counted as a pass).
"""
from __future__ import annotations

from typing import Callable, Iterable, List, Optional, Union

from .verify import adapters as _adapters
from .verify.cases import Case, catalogue
from .verify.properties import NA, Result, check_case


def cases(op: str = "kda", *, long: bool = False, props: Optional[Iterable[str]] = None) -> List[Case]:
    """The catalogue of `op` (long cases only when long), optionally only the given properties."""
    cs = catalogue(op, long=long)
    if props is not None:
        keep = set(props)
        cs = [c for c in cs if c.prop in keep]
    return cs


def parametrize_cases(op: str = "kda", *, long: bool = False, props: Optional[Iterable[str]] = None,
                      argname: str = "case"):
    """pytest.mark.parametrize over the catalogue, one test per case, ids = case names."""
    import pytest
    cs = cases(op, long=long, props=props)
    return pytest.mark.parametrize(argname, cs, ids=[c.name for c in cs])


def check(candidate: Callable, case: Case, adapter: Union[str, _adapters.Adapter, None] = None,
          truth: str = "float64") -> Result:
    """The Result of one case (adapter: a spec or an Adapter; default the canonical adapter of the case's op)."""
    ad = adapter if isinstance(adapter, _adapters.Adapter) else _adapters.make_adapter(
        adapter or ("canonical" if case.op == "kda" else "mla-canonical"), candidate)
    return check_case(ad, case, {"truth": truth})


def failure_message(case: Case, r: Result) -> str:
    return (f"case {case.name} ({case.prop}) seed {case.seed}: {r.verdict}\n"
            f"  reproduce: {case.call()}\n  {r.detail}")


def assert_case_passes(candidate: Callable, case: Case, adapter: Union[str, _adapters.Adapter, None] = None,
                       truth: str = "float64") -> Result:
    """Asserts the candidate is within the noise of its precision on the case (and every exact property holds);
    skips the test when the adapter cannot run the case. Returns the Result."""
    r = check(candidate, case, adapter, truth)
    if r.kind == NA:
        import pytest
        pytest.skip(f"{case.name}: {NA}: {r.detail}")
    if not r.passed:
        raise AssertionError(failure_message(case, r))
    return r
