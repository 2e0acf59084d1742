#!/usr/bin/python3
"""Prints the key numbers of each kdalab results file: where it came from, then one small table per
results table (the rows as they are when there are few, else the median and max of its main metrics per
implementation / memory / layout), with the units the file records on each column (`units` attribute;
nothing is printed for a dimensionless "1" or a missing unit), and the groups' notes.

An empty table prints "0 rows". A path that is missing or not an HDF5 file, an HDF5 file that cannot be opened (e.g.
truncated), and a file whose objects cannot be read as tables (a text metric, a missing column, text that is not UTF-8)
get one line "summary.py: error: FILE: ..." on stderr naming the object and the cause (the other files are still
summarised) and the exit code is then 2.

Usage: /usr/bin/python3 scripts/summary.py results/*.h5
"""
import os
import signal
import sys
import textwrap

import h5py
import numpy as np

MAX_ROWS = 12  # a table with at most this many rows (after `where`) is printed as it is

# What to print for the tables kdalab writes. cols: the columns shown (rows as they are); by + metrics:
# one line per value of the `by` columns with each metric's median and max over its rows; where: keeps
# the rows a callable on the columns selects (with a callable on the columns that describes them, e.g. "at the
# largest n = 1048576"); sums: columns summed per `by` value; skip_if: a sibling table that already summarises this
# one. A metric with no finite value in a group prints what the file stores (inf, nan), never a made-up NaN.
SPEC = {
    "recall/capacity": dict(by=["memory"], metrics=["accuracy", "rel_err"]),
    "copy/accuracy": dict(by=["memory"], metrics=["copy_accuracy", "token_accuracy", "rel_err"]),
    # o_nan + o_inf: the non-finite values of o, the count kdalab decay-range prints beside rel_rms ("inf (3168)")
    "decay_range/table": dict(by=["impl", "precision"], metrics=["rel_rms"], sums=["o_nan", "o_inf", "overflow",
                                                                                 "underflow"]),
    "decode_cost/analytic": dict(cols=["n", "d", "softmax_reads", "kda_reads", "ratio"]),
    "decode_cost/cpu": dict(cols=["impl", "n", "d", "seconds_per_token"]),
    "decode_cost/gpu": dict(cols=["n", "kda_layer_s", "mla_layer_s", "mla_bytes_per_s", "speedup_48b"]),
    "decode_cost/hybrid": dict(cols=["layout", "n", "batch_kind", "batch", "seconds_per_token", "speedup_vs_mla"],
                               where=(lambda c: c["n"] == np.max(c["n"]),
                                      lambda c: f"at the largest n = {fmt(np.max(c['n']))}")),
    "parity/summary": dict(cols=["impl", "state_precision", "matmul_precision", "rows", "o_rel_rms_median",
                                 "o_rel_rms_worst", "S_rel_rms_median", "S_rel_rms_worst"]),
    "parity/table": dict(skip_if="parity/summary"),
    "bench/*": dict(cols=["key", "time_ms", "graph_ms", "TBps", "TFLOPps", "pct_copy", "pct_matmul", "ratio_vs_baseline",
                          "speedup_vs_peer"]),
}
# For an unknown table with many rows: these columns (the first present) group it, these are its metrics.
GENERIC_BY = ["impl", "memory", "layout", "precision", "key"]
GENERIC_METRICS = ["o_rel_rms", "rel_rms", "rel_err", "accuracy", "time_ms", "seconds_per_token", "speedup_vs_mla",
                   "ratio_vs_baseline", "TBps", "TFLOPps"]


def text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def unit_of(ds):
    """The column's unit as recorded, or "" for a dimensionless "1" or no `units` attribute."""
    u = text(ds.attrs.get("units", "")).strip()
    return "" if u in ("", "1") else u


def head(name, ds):
    u = unit_of(ds)
    return f"{name} [{u}]" if u else name


def fmt(v):
    """A cell as printed: text as is, integers whole, other numbers with 4 significant digits; a non-finite number as
    kdalab's console prints it (inf, -inf, nan)."""
    if isinstance(v, (bytes, str)):
        return text(v)
    if isinstance(v, (np.integer, int)) or (isinstance(v, np.ndarray) and v.dtype.kind in "iu"):
        return str(int(v))
    v = float(v)
    if np.isnan(v):
        return "nan"
    if v == 0:
        return "0"
    return f"{v:.4g}"


def columns(g):
    """The 1-D datasets of a group that all have the group's common length, as {name: (dataset, array)}."""
    cols = {}
    for k, ds in g.items():
        if isinstance(ds, h5py.Dataset) and len(ds.shape) == 1:
            a = ds[()]
            if a.dtype.kind in ("O", "S"):
                a = np.array([text(x) for x in a])
            cols[k] = (ds, a)
    lengths = {len(a) for _, a in cols.values()}
    return cols if len(lengths) == 1 else {}


def print_table(headers, rows, indent="    "):
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    print(indent + "  ".join(h.rjust(w) for h, w in zip(headers, widths)))
    for r in rows:
        print(indent + "  ".join(c.rjust(w) for c, w in zip(r, widths)))


def stats(a):
    """median and max over the finite values of a, and how many are not finite. With no finite value, both are the
    values stored, when they agree (inf for decay-range's rows whose o has NaN/Inf), else "inf/nan" (text)."""
    a = np.asarray(a, dtype=float)
    fin = a[np.isfinite(a)]
    if fin.size:
        return np.median(fin), np.max(fin), int(a.size - fin.size)
    if a.size == 0:
        return np.nan, np.nan, 0
    kinds = sorted({fmt(x) for x in a})  # "inf", "-inf", "nan"
    stored = a[0] if len(kinds) == 1 else "/".join(kinds)
    return stored, stored, int(a.size)


def summarise_table(path, g, f):
    cols = columns(g)
    if not cols:
        return False
    n = len(next(iter(cols.values()))[1])
    spec = SPEC.get(path, SPEC.get(path.rsplit("/", 1)[0] + "/*"))
    if spec is None:  # an unknown table: its text columns and known metrics, or those summarised per key
        by = [c for c in GENERIC_BY if c in cols][:1]
        metrics = [c for c in GENERIC_METRICS if c in cols][:3]
        first = [c for c in cols if cols[c][1].dtype.kind == "U"] + metrics
        show = (first + [c for c in cols if c not in first])[:8]
        spec = dict(cols=show) if n <= MAX_ROWS or not metrics else dict(by=by, metrics=metrics)
    if n == 0:  # an empty table: nothing to summarise (a `where` or a median over no rows would fail)
        print(f"  {path}: 0 rows, {len(cols)} columns (empty)")
        return True
    if "skip_if" in spec and spec["skip_if"] in f:
        print(f"  {path}: {n} rows, {len(cols)} columns (summarised in {spec['skip_if']})")
        return True
    sel = np.ones(n, dtype=bool)
    where = ""
    if "where" in spec:
        sel = np.asarray(spec["where"][0]({k: a for k, (_, a) in cols.items()}), dtype=bool)
        where = spec["where"][1]({k: a for k, (_, a) in cols.items()})
    if "cols" in spec:
        show = [c for c in spec["cols"] if c in cols]
        idx = np.nonzero(sel)[0]
        print(f"  {path}: {n} rows" + (f"; the {len(idx)} {where}" if where else ""))
        rows = [[fmt(cols[c][1][i]) for c in show] for i in idx[:MAX_ROWS]]
        print_table([head(c, cols[c][0]) for c in show], rows)
        if len(idx) > MAX_ROWS:
            print(f"    ... {len(idx) - MAX_ROWS} more rows")
        return True
    by = [c for c in spec.get("by", []) if c in cols]
    metrics = [m for m in spec.get("metrics", []) if m in cols]
    sums = [s for s in spec.get("sums", []) if s in cols]
    keys = []
    for i in np.nonzero(sel)[0]:
        k = tuple(text(cols[b][1][i]) for b in by)
        if k not in keys:
            keys.append(k)
    print(f"  {path}: {n} rows" + (f"; the {int(sel.sum())} {where}" if where else "")
          + (f"; per {', '.join(by)}: median and max" if by else "; median and max")
          + (" over the finite values (NaN/Inf rows counted; with none, the value stored)" if metrics else ""))
    headers = by + ["rows"]
    for m in metrics:
        headers += [f"{m} median", f"{m} max"]
    u = {m: unit_of(cols[m][0]) for m in metrics + sums}
    headers = [h + (f" [{u[h.rsplit(' ', 1)[0]]}]" if h.rsplit(" ", 1)[0] in u and u[h.rsplit(" ", 1)[0]] else "")
               for h in headers]
    if any(stats(cols[m][1][sel])[2] for m in metrics):
        headers.append("NaN/Inf rows")
    headers += [f"{s} (sum)" for s in sums]
    rows = []
    for k in keys:
        rsel = sel.copy()
        for b, v in zip(by, k):
            rsel &= cols[b][1] == v
        r = list(k) + [str(int(rsel.sum()))]
        bad = 0
        for m in metrics:
            med, mx, nb = stats(cols[m][1][rsel])
            r += [fmt(med), fmt(mx)]
            bad += nb
        if "NaN/Inf rows" in headers:
            r.append(str(bad))
        r += [fmt(np.sum(cols[s][1][rsel])) for s in sums]
        rows.append(r)
    print_table(headers, rows)
    return True


def notes(name, obj):
    """A group's `note` / `notes` attribute: one or two lines printed whole (wrapped), more one line each."""
    for key in ("note", "notes"):
        if key in obj.attrs:
            v = text(obj.attrs[key])
            if v and v != "none":
                lines = v.splitlines()
                for line in lines:
                    if len(lines) <= 2:
                        print(textwrap.fill(f"{name} {key}: {line}", width=150, initial_indent="  ",
                                            subsequent_indent="    "))
                    else:
                        print("  " + textwrap.shorten(f"{name} {key}: {line}", width=150, placeholder=" …"))


def main(paths):
    if not paths:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    bad = 0
    for p in paths:
        # a path that is missing or not HDF5: one line and exit 2 at the end (the other files are still summarised)
        why = "no such file" if not os.path.isfile(p) else ("not an HDF5 file" if not h5py.is_hdf5(p) else "")
        if why:
            print(f"summary.py: error: {p}: {why}", file=sys.stderr)
            bad += 1
            continue
        try:
            f = h5py.File(p, "r")
        except OSError as e:  # an HDF5 signature, but the file cannot be opened (truncated, damaged)
            print(f"summary.py: error: {p}: not a readable HDF5 file ({(str(e).splitlines() or [''])[0]})",
                  file=sys.stderr)
            bad += 1
            continue
        at = ["/"]  # the object being summarised, for the message when it cannot be
        try:
            summarise_file(p, f, at)
        except (OSError, ValueError, TypeError, KeyError, IndexError) as e:  # a file of another layout than kdalab's
            print(f"summary.py: error: {p}: {at[0]}: cannot summarise it ({type(e).__name__}: "
                  f"{(str(e).splitlines() or [''])[0]})", file=sys.stderr)
            bad += 1
        finally:
            f.close()
        print()
    return 2 if bad else 0


def summarise_file(p, f, at):
    """Prints the summary of file p, open as f; at[0] is kept at the object being read."""
    a = f.attrs
    print(f"{p}: {text(a.get('software', '?'))} {text(a.get('software_version', '?'))} git "
          f"{text(a.get('git_sha', '?'))}, {text(a.get('date', '?'))}, seed {text(a.get('seed', '?'))}")
    print(f"  command: {text(a.get('command_line', '?'))}")
    done = set()

    def visit(name, obj):
        at[0] = name
        if isinstance(obj, h5py.Group):
            if summarise_table(name, obj, f):
                done.update(f"{name}/{k}" for k in columns(obj))
            notes(name, obj)
        elif name not in done and len(obj.shape) != 1:
            u = unit_of(obj)
            print(f"  {name}: {' x '.join(map(str, obj.shape)) or 'scalar'}" + (f" [{u}]" if u else ""))

    f.visititems(visit)


if __name__ == "__main__":
    # a reader that stops early (`summary.py results/*.h5 | head`) ends the script quietly, as it does `cat`, instead of
    # a BrokenPipeError traceback
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main(sys.argv[1:]))
