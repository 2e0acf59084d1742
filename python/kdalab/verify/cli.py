"""The command line of `kdalab verify` (`python -m kdalab.verify`, console script `kdalab-verify`).

Exit codes (docs/cli.md): 0 every checked case within budget, 1 a failed verdict, 2 bad input (one line, nothing
written), 4 nothing was checked (every case not applicable), 5 the report could not be written.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from typing import Any, Dict, List, Optional

from . import adapters as adapters_mod
from .cases import catalogue
from .runner import DEFAULTS, replay, run, select


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one clear line, exit 2
        sys.stderr.write(f"kdalab-verify: error: {message}\n")
        sys.exit(2)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="kdalab-verify", description=(
        "Run kdalab's catalogue of adversarial and metamorphic cases against a candidate kernel, through an "
        "adapter for its calling convention, against kdalab's oracle. Prints one line per case and a summary; "
        "writes an HDF5 report with every failure's reproducer. Documentation: docs/verify.md."))
    p.add_argument("--op", choices=sorted(DEFAULTS), default="kda", help="the operation (default: kda)")
    p.add_argument("--candidate", metavar="MODULE:FUNCTION",
                   help="the candidate callable (default: the numpy candidate of the op, "
                        "kdalab.verify.candidates:numpy_kda or :numpy_mla_decode)")
    p.add_argument("--adapter", metavar="NAME[:key=value,...]",
                   help=f"its calling convention: {', '.join(adapters_mod.ADAPTERS)} (default: canonical for kda, "
                        "mla-canonical for mla_decode); options per adapter in docs/verify.md")
    p.add_argument("--cases", metavar="PATTERN[,PATTERN...]",
                   help="case names or glob patterns (default: every case; `--list` shows them)")
    p.add_argument("--long", action="store_true", help="include long cases (T >= 1000; skipped by default)")
    p.add_argument("--param", metavar="KEY=VALUE", action="append", default=[],
                   help="override a generator parameter in every case whose generator takes it, e.g. d_k=128 "
                        "(VALUE read as JSON, else text); repeatable")
    p.add_argument("--truth", choices=["float64", "mp50"], default="float64",
                   help="the oracle's precision (default: float64; mp50 is 50 decimal digits, slower)")
    p.add_argument("--out", metavar="FILE.h5",
                   help="the report (default: results/verify-OP.h5, its folder made when missing); the folder of a given FILE must exist; an existing file is never overwritten")
    p.add_argument("--no-report", action="store_true", help="write no report")
    p.add_argument("--replay", metavar="REPORT.h5", help="re-run one case of a report exactly (with --case)")
    p.add_argument("--case", metavar="NAME", help="the case to replay (with --replay)")
    p.add_argument("--list", action="store_true", help="list the cases of the op and exit (writes nothing)")
    p.add_argument("--quiet", action="store_true", help="print only the summary")
    return p


def _params(items: List[str]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ValueError(f"--param {item!r} is not KEY=VALUE")
        if key in out:
            raise ValueError(f"--param {key} is given twice; give each key once")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = _parser()
    a = p.parse_args(argv)
    printer = (lambda s: None) if a.quiet else print
    try:
        if a.list:
            for c in catalogue(a.op, long=True):
                print(f"{c.name:<26}{c.prop:<20}{'long ' if c.long else ''}{c.call()}  -- {c.about}")
            return 0
        if (a.replay is None) != (a.case is None):
            raise ValueError("--replay and --case go together")
        # options that would have no effect are refused, never ignored
        if a.out is not None and a.out == "":
            raise ValueError("--out '': give a file name (e.g. --out results/verify-kda.h5) or --no-report")
        if a.no_report and a.out is not None:
            raise ValueError(f"--out {a.out} with --no-report: give one of them")
        if a.replay is not None:
            extra = [o for o, given in (("--cases", a.cases is not None), ("--param", bool(a.param)),
                                        ("--long", a.long), ("--out", a.out is not None),
                                        ("--no-report", a.no_report)) if given]
            if extra:
                raise ValueError(f"{extra[0]} has no effect with --replay (it re-runs the recorded case and writes no "
                                 "report); leave it out")
        if a.replay is not None:
            rep = replay(a.replay, a.case, candidate=a.candidate, adapter=a.adapter, printer=printer)
            return rep.exit_code()
        params = _params(a.param)
        cases = [s for s in a.cases.split(",") if s] if a.cases is not None else None
        out = None if a.no_report else (a.out or f"results/verify-{a.op}.h5")
        # validate everything before running anything, so bad input writes nothing
        select(a.op, cases, long=a.long, params=params)
        name, _ = adapters_mod.parse_spec(DEFAULTS[a.op][1] if a.adapter is None else a.adapter)
        # kdalab's own kernels (kdalab-cuda, kdalab-mla-cuda) are their adapter's entry point unless --candidate
        own = getattr(adapters_mod.ADAPTERS[name], "entry_point", None)
        import os
        if out is not None and os.path.exists(out):
            raise ValueError(f"--out {out} exists; a report is never overwritten (choose another name)")
        if out is not None and a.out is None:
            os.makedirs(os.path.dirname(out), exist_ok=True)  # the default folder results/ is made when missing
        elif out is not None and not os.path.isdir(os.path.dirname(out) or "."):
            raise ValueError(f"--out {out}: its folder does not exist (create it first)")
        rep = run(a.candidate or (None if own else DEFAULTS[a.op][0]), a.op, cases, adapter=a.adapter, long=a.long,
                  params=params, truth=a.truth, out=out, printer=printer,
                  command_line=" ".join(shlex.quote(s) for s in ["kdalab-verify"] + argv))
        if a.quiet:
            print(rep.summary())
        return rep.exit_code()
    except ValueError as e:
        sys.stderr.write(f"kdalab-verify: error: {e}\n")
        return 2
    except (OSError, RuntimeError) as e:  # RuntimeError: the results writer's environment failure (no such folder,
        # no space, permission), raised after the cases ran; nothing was written
        sys.stderr.write(f"kdalab-verify: error: {e}\n")
        return 5
    except KeyboardInterrupt:  # Ctrl-C (also inside a candidate that hangs): one line, no traceback
        sys.stderr.write("kdalab-verify: interrupted; no report was written\n")
        return 130
