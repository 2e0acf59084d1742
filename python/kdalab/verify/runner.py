"""Running a catalogue against a candidate, printing its lines and summary, and the HDF5 report."""
from __future__ import annotations

import dataclasses
import fnmatch
import importlib
import json
import os
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Union

import numpy as np

import kdalab

from . import adapters as adapters_mod
from .cases import GENERATORS, Case, accepted_params, catalogue, check_params, find, with_params
from .properties import BROKEN, NA, OVER, WITHIN, Result, check_case

DEFAULTS = {
    "kda": ("kdalab.verify.candidates:numpy_kda", "canonical"),
    "mla_decode": ("kdalab.verify.candidates:numpy_mla_decode", "mla-canonical"),
}
KINDS = (WITHIN, OVER, BROKEN, NA)


@dataclasses.dataclass
class Report:
    """The results of one run: one Result per case, in catalogue order."""
    op: str
    candidate: str
    adapter: str
    cases: List[Case]
    results: List[Result]

    @property
    def failures(self) -> List[Result]:
        return [r for r in self.results if r.kind in (OVER, BROKEN)]

    @property
    def checked(self) -> int:
        return sum(r.kind != NA for r in self.results)

    def exit_code(self) -> int:
        """0 every checked case passed, 1 some failed, 4 nothing was checked (docs/cli.md exit codes)."""
        if self.failures:
            return 1
        return 0 if self.checked else 4

    def summary(self) -> str:
        """The summary table: one row per property, the count of each verdict."""
        props = list(dict.fromkeys(r.prop for r in self.results))
        head = ["property", "within", "over", "broken", "n/a"]
        rows = [[p] + [str(sum(r.prop == p and r.kind == k for r in self.results)) for k in KINDS] for p in props]
        rows.append(["total"] + [str(sum(r.kind == k for r in self.results)) for k in KINDS])
        w = [max(len(x[i]) for x in [head] + rows) for i in range(len(head))]
        fmt = lambda row: "  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(row))
        return "\n".join([fmt(head), fmt(["-" * n for n in w])] + [fmt(r) for r in rows])


def load_candidate(spec: str) -> Callable:
    """"MODULE:FUNCTION" -> the callable; ValueError naming what is wrong."""
    mod, colon, fn = spec.partition(":")
    if not colon or not mod or not fn:
        raise ValueError(f"--candidate {spec!r} is not MODULE:FUNCTION")
    try:
        m = importlib.import_module(mod)
    except ImportError as e:
        raise ValueError(f"--candidate {spec!r}: module {mod!r} cannot be imported ({e})") from e
    obj = m
    for part in fn.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"--candidate {spec!r}: {mod!r} has no attribute {fn!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"--candidate {spec!r} is not callable")
    return obj


def select(op: str, patterns: Optional[Iterable[str]] = None, *, long: bool = False,
           params: Optional[Dict[str, Any]] = None) -> List[Case]:
    """The catalogue cases of `op` whose names match any glob pattern (all when none), with parameter overrides.
    A pattern that names a case exactly selects it even when it is long."""
    pats = list(patterns or [])
    if patterns is not None and not pats:  # `--cases ""` or `--cases ,`: not "every case", not "no case"
        raise ValueError("--cases names no case (an empty list of patterns); give names or glob patterns, or leave "
                         "--cases out for every case (`--list` shows them)")
    cs = catalogue(op, long=True)
    if pats:
        cs = [c for c in cs if any(fnmatch.fnmatchcase(c.name, p) for p in pats)
              and (long or not c.long or c.name in pats)]
        if not cs:
            raise ValueError(f"--cases {','.join(pats)!r} matches no case of op {op}; `--list` shows them")
    else:
        cs = [c for c in cs if long or not c.long]
    check_params(cs, params or {})
    return with_params(cs, params or {})


def line(r: Result) -> str:
    tag = {WITHIN: "ok", OVER: "OVER", BROKEN: "BROKEN", NA: "n/a"}[r.kind]
    num = f"{r.rel_rms:.2e}/{r.tol:.1e}" if r.kind in (WITHIN, OVER) and r.tol == r.tol and r.tol > 0 else ""
    verdict = r.verdict if r.kind != NA else f"{NA}: {r.detail}"
    extra = f"  [{r.detail}]" if r.kind in (OVER, BROKEN) else ""
    return f"{tag:<7}{r.case:<26}{r.prop:<20}{num:<18}{verdict}{extra}"


def run(candidate: Union[str, Callable, None], op: str = "kda", cases: Optional[Sequence[Union[str, Case]]] = None, *,
        adapter: Union[str, adapters_mod.Adapter, None] = None, long: bool = False,
        params: Optional[Dict[str, Any]] = None, truth: str = "float64", out: Optional[str] = None,
        command_line: str = "", printer: Optional[Callable[[str], None]] = print) -> Report:
    """Runs the catalogue (or `cases`: names, glob patterns or Case objects) of `op` against `candidate`
    (a callable or "MODULE:FUNCTION"; None: the adapter's own entry point, kdalab-cuda and kdalab-mla-cuda) through
    `adapter` (a spec "NAME[:key=value,...]" or an Adapter; default the canonical one of the op). Prints one line
    per case and the summary unless printer is None; writes the HDF5 report to `out` when given (refusing an
    existing file). Returns the Report."""
    if op not in DEFAULTS:
        raise ValueError(f"op = {op!r}; accepted: {', '.join(DEFAULTS)}")
    if truth not in ("float64", "mp50"):
        raise ValueError(f"truth = {truth!r}; accepted: float64, mp50")
    if out is not None and os.path.exists(out):
        raise ValueError(f"--out {out} exists; a report is never overwritten (choose another name)")
    cand_name = candidate if isinstance(candidate, str) else f"{getattr(candidate, '__module__', '?')}:" \
                                                             f"{getattr(candidate, '__qualname__', repr(candidate))}"
    fn = load_candidate(candidate) if isinstance(candidate, str) else candidate
    ad = adapter if isinstance(adapter, adapters_mod.Adapter) else \
        adapters_mod.make_adapter(DEFAULTS[op][1] if adapter is None else adapter, fn)
    if ad.op != op:
        raise ValueError(f"--adapter {ad.name} runs {ad.op}, not --op {op}")
    if candidate is None:
        cand_name = getattr(ad, "entry_point", "None")
    if cases and all(isinstance(c, Case) for c in cases):
        selected = list(cases)
    else:
        selected = select(op, cases, long=long, params=params)
    results = []
    for c in selected:
        r = check_case(ad, c, {"truth": truth})
        results.append(r)
        if printer:
            printer(line(r))
    rep = Report(op=op, candidate=cand_name, adapter=ad.describe(), cases=selected, results=results)
    if printer:
        printer("")
        printer(rep.summary())
    if out is not None:
        write_report(rep, out, command_line=command_line,
                     config={"op": op, "candidate": cand_name, "adapter": ad.describe(), "long": long,
                             "params": params or {}, "truth": truth, "precision": ad.precision,
                             "cases": [c.name for c in selected],
                             # each case's generator call and tensors, so that --replay of any case (passed or
                             # failed) refuses a catalogue that now builds it otherwise
                             "calls": {c.name: c.call() for c in selected},
                             "shapes": {c.name: _shapes(c) for c in selected}})
        if printer:
            printer(f"report: {out}")
    return rep


def _shapes(c: Case) -> str:
    try:
        x = c.inputs()
    except Exception as e:  # a case whose parameters its generator refuses
        return f"(not generated: {e})"
    return ", ".join(f"{k} {list(v.shape)}" for k, v in x.items() if isinstance(v, np.ndarray))


def write_report(rep: Report, out: str, *, command_line: str = "", config: Optional[Dict[str, Any]] = None) -> None:
    """The HDF5 report (docs/verify.md, "Report"): the results writer's root attributes; /verify with the candidate
    and adapter; /verify/cases a table (one row per case); /verify/failures/NNN one group per failure with its
    reproducer (case, property, seed, shapes, the generator call, the case as JSON)."""
    seeds = ",".join(str(c.seed) for c in rep.cases)
    with kdalab.ResultsFile(out, command_line=command_line, config=json.dumps(config or {}, sort_keys=True),
                            seed=seeds) as f:
        f.group("verify", "kdalab verify: a candidate kernel against kdalab's oracle on a catalogue of cases")
        for k, v in (("op", rep.op), ("candidate", rep.candidate), ("adapter", rep.adapter),
                     ("exit_code", float(rep.exit_code()))):
            f.attr("verify", k, v)
        res = rep.results
        f.write_table("verify/cases", [
            ("case", "", "case name", [r.case for r in res]),
            ("property", "", "property checked", [r.prop for r in res]),
            ("verdict", "", "verdict", [r.verdict for r in res]),
            ("passed", "1", "1 when the verdict is within the noise of its precision", [int(r.passed) for r in res]),
            ("rel_rms", "1", "worst relative RMS error of the compared outputs (nan: none)", [r.rel_rms for r in res]),
            ("budget", "1", "its budget (relative RMS)", [r.tol for r in res]),
            ("seed", "1", "the generator seed", [c.seed for c in rep.cases]),
            ("call", "", "the generator call", [c.call() for c in rep.cases]),
            ("detail", "", "metrics, spread or the reason", [r.detail for r in res]),
        ])
        f.group("verify/failures", "one group per failure: its reproducer (replay with --replay FILE --case NAME)")
        n = 0
        for c, r in zip(rep.cases, res):
            if r.kind not in (OVER, BROKEN):
                continue
            g = f"verify/failures/{n:03d}"
            f.group(g, f"failure of case {c.name}")
            for k, v in (("case", c.name), ("property", c.prop), ("verdict", r.verdict), ("detail", r.detail),
                         ("seed", float(c.seed)), ("generator_call", c.call()), ("shapes", _shapes(c)),
                         ("case_json", c.to_json())):
                f.attr(g, k, v)
            n += 1
        f.attr("verify/failures", "count", float(n))


def replay(report: str, name: str, *, candidate: Union[str, Callable, None] = None,
           adapter: Optional[str] = None, printer: Optional[Callable[[str], None]] = print) -> Report:
    """Re-runs case `name` of a report exactly: its recorded generator call (a failure's reproducer, else the
    catalogue case with the run's parameter overrides), against the recorded candidate and adapter unless given."""
    if not report:
        raise ValueError("--replay '': give a report file (REPORT.h5) written by kdalab-verify")
    if os.path.isdir(report):
        raise ValueError(f"--replay {report}: is a directory; give a report file (REPORT.h5) written by kdalab-verify")
    if os.path.exists(report) and not os.path.isfile(report):
        raise ValueError(f"--replay {report}: is not a regular file (a device, pipe or socket); give a report file "
                         "(REPORT.h5) written by kdalab-verify")
    if not os.path.isfile(report):
        raise ValueError(f"--replay {report}: no such file")
    if not kdalab.exists(report, "verify"):
        raise ValueError(f"--replay {report}: not a kdalab verify report (no group /verify)")
    # a damaged or foreign report is bad input naming what is wrong, never a traceback
    try:
        config = json.loads(str(kdalab.read_attr(report, "/", "config")))
    except json.JSONDecodeError as e:
        raise ValueError(f"--replay {report}: its root attribute config is not JSON ({e})") from e
    if not isinstance(config, dict) or not isinstance(config.get("cases", []), list) or \
            not all(isinstance(config.get(k), str) for k in ("op", "candidate", "adapter")) or \
            not all(isinstance(c, str) for c in config.get("cases", [])) or \
            not isinstance(config.get("params", {}), dict) or not isinstance(config.get("truth", "float64"), str) or \
            not all(isinstance(config.get(k, {}), dict) and all(isinstance(v, str) for v in config.get(k, {}).values())
                    for k in ("calls", "shapes")):
        raise ValueError(f"--replay {report}: its root attribute config is not a verify run's (a JSON object with "
                         "op, candidate, adapter as text, cases a list of names, params an object, calls and shapes "
                         "objects of text)")
    case = None
    for m in kdalab.members(report, "verify/failures"):
        g = f"verify/failures/{m}"
        if str(kdalab.read_attr(report, g, "case")) == name:
            try:
                case = Case.from_json(str(kdalab.read_attr(report, g, "case_json")))
            except (ValueError, TypeError) as e:
                raise ValueError(f"--replay {report}: the reproducer of case {name!r} ({g}/case_json) is damaged "
                                 f"({e})") from e
            if case.generator not in GENERATORS:
                raise ValueError(f"--replay {report}: the reproducer of case {name!r} names the generator "
                                 f"{case.generator!r}, which is not one of kdalab's ({', '.join(GENERATORS)})")
            # a generator changed since the report (e.g. a tensor added) would replay other inputs: refused
            try:
                recorded_shapes = str(kdalab.read_attr(report, g, "shapes"))
            except ValueError:  # a reproducer without its shapes: nothing to compare
                recorded_shapes = None
            shapes = _shapes(case)
            if recorded_shapes is not None and shapes != recorded_shapes:
                raise ValueError(f"--replay {report}: case {name!r}: its generator call {case.call()} now makes other "
                                 f"tensors than the report's, so this kdalab cannot replay it exactly (recorded: "
                                 f"{recorded_shapes}; now: {shapes}); run the case again with --cases {name}")
    if case is None:
        if name not in config.get("cases", []):
            raise ValueError(f"--case {name!r} is not in {report}; its cases: {', '.join(config.get('cases', []))}")
        try:
            recorded = find(name, config["op"])
        except KeyError:
            raise ValueError(f"--replay {report}: its case {name!r} is not in kdalab's catalogue of op "
                             f"{config['op']!r} (`--list --op OP` shows them)") from None
        params = {k: v for k, v in config.get("params", {}).items() if k in accepted_params(recorded.generator)}
        try:
            check_params([recorded], params)
        except ValueError as e:
            raise ValueError(f"--replay {report}: its recorded parameters do not fit case {name!r} ({e})") from None
        case = with_params([recorded], params)[0]
    # the case as the report recorded it (reports of older kdalab versions have no calls or shapes: nothing to compare)
    recorded_call, recorded_shapes = config.get("calls", {}).get(name), config.get("shapes", {}).get(name)
    if recorded_call is not None and recorded_call != case.call():
        raise ValueError(f"--replay {report}: case {name!r}: the report ran the generator call {recorded_call}, this "
                         f"kdalab's catalogue now makes {case.call()}, so it cannot replay it exactly; run the case "
                         f"again with --cases {name}")
    if recorded_shapes is not None:
        shapes = _shapes(case)
        if shapes != recorded_shapes:
            raise ValueError(f"--replay {report}: case {name!r}: its generator call {case.call()} now makes other "
                             f"tensors than the report's, so this kdalab cannot replay it exactly (recorded: "
                             f"{recorded_shapes}; now: {shapes}); run the case again with --cases {name}")
    spec = config["adapter"] if adapter is None else adapter
    # a report of kdalab's own kernels records the adapter's entry point as its candidate: replayed as that adapter
    # looks it up (None), so a build without it says "not applicable" (exit 4) as the run itself does, not bad input
    own = getattr(adapters_mod.ADAPTERS[adapters_mod.parse_spec(spec)[0]], "entry_point", None)
    recorded = None if own is not None and config["candidate"] == own else config["candidate"]
    return run(candidate or recorded, config["op"], [case], adapter=spec, truth=config.get("truth", "float64"),
               printer=printer)
