#!/usr/bin/python3
"""Print the current-numbers table (markdown) of kdalab's kernels from bench baselines.

Usage:
  scripts/results_table.py [FILE.h5 ...] [--readme README.md [--marker NAME]]

Without files it reads data/baselines/*.h5 (sorted by name). Each file is a `kdalab bench`
results file: one table per op under /bench/<op> (docs/results-schema.md). For every op the
rows come from one file: the file whose name names the op's family (`kda` for kda_prefill and
kda_decode, `mla` for mla_decode and mla_prefill), else the file with the latest `date`
attribute. Rows of the accurate precision (keys ending in ` accurate`, from `bench --precision
accurate`) are a class of their own, chosen by the same rule among the files that hold them, so a
folder with both precisions' files gives both, each from its own file. Under the table, one line
per file used gives its command line, settings, device, git sha and date (root attributes);
directories in paths are dropped, so the text names no machine's folders.

--readme FILE rewrites, in place, the lines between `<!-- results-table:begin -->` and
`<!-- results-table:end -->` of FILE (--marker NAME: between `<!-- NAME:begin -->` and `<!-- NAME:end -->`, for a
second table in the same file, such as another card's); without it the table goes to stdout. Output depends only
on the files' contents (no clock, no host): the same files give the same text.

Runs under /usr/bin/python3 (Debian's h5py); needs nothing else.
"""
import argparse
import glob
import json
import math
import os
import re
import sys

BEGIN = "<!-- results-table:begin -->"
END = "<!-- results-table:end -->"

OP_ORDER = ["kda_prefill", "kda_decode", "kda_backward", "mla_decode", "mla_prefill", "attn_res"]
FAMILY = {"kda_prefill": "kda", "kda_decode": "kda", "kda_backward": "kda", "mla_decode": "mla", "mla_prefill": "mla"}
# settings worth showing from the config attribute (the rest are paths or defaults of the run)
SETTINGS = ["op", "shapes", "iters", "warmup", "state-pass", "segments", "overlap", "quick", "seed"]


def fail(msg):
    sys.stderr.write("results_table.py: " + msg + "\n")
    sys.exit(2)


def text(v):
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return str(v)


_PATH = re.compile(r"(?<![\w.])(/[^\s\"',;]+)")


def strip_dirs(s):
    """Replace every absolute path in s by its last component (no machine's folders in the output)."""
    return _PATH.sub(lambda m: os.path.basename(m.group(1).rstrip("/")) or m.group(1), s)


def fmt_num(x, digits=3):
    if x is None or not math.isfinite(x):
        return ""
    if x == 0:
        return "0"
    mag = math.floor(math.log10(abs(x)))
    decimals = max(0, digits - 1 - mag)
    return f"{x:.{decimals}f}"


def fmt_time(ms):
    """A time in ms as 'N us' below 1 ms, else 'N ms', 3 significant digits."""
    if ms is None or not math.isfinite(ms):
        return ""
    if ms < 1.0:
        return fmt_num(ms * 1e3) + " us"
    return fmt_num(ms) + " ms"


def read_file(path, h5py):
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        fail(f"'{path}' is not a readable HDF5 file: {e}")
    with f:
        attrs = {k: text(f.attrs[k]) for k in ("command_line", "config", "device", "git_sha", "date") if k in f.attrs}
        ops = {}
        if "bench" not in f:
            fail(f"'{path}' has no /bench group: not a kdalab bench results file")
        bench = f["bench"]
        ceilings = {k: float(bench.attrs[k]) for k in ("copy_ceiling_TBps", "matmul_ceiling_TFLOPps") if k in bench.attrs}
        for op in bench:
            g = bench[op]
            if not hasattr(g, "keys") or "key" not in g or "time_ms" not in g:
                continue
            n = len(g["key"])
            cols = {}
            for c in g.keys():
                d = g[c]
                if getattr(d, "ndim", 0) == 1 and len(d) == n:
                    cols[c] = [text(v) if d.dtype.kind in "OSU" else float(v) for v in d[()]]
            ops[op] = [{c: cols[c][i] for c in cols} for i in range(n)]
    return {"path": path, "name": os.path.basename(path), "attrs": attrs, "ops": ops, "ceilings": ceilings}


def row_class(row):
    """'accurate' for a row of the accurate precision (its key ends in ' accurate'), else ''."""
    return "accurate" if str(row.get("key", "")).endswith(" accurate") else ""


def pick_sources(files):
    """(op, row class) -> file dict: among the files holding rows of that op and class, the file named after the
    op's family, else the newest by its date attribute."""
    chosen = {}
    all_ops = sorted({op for f in files for op in f["ops"]}, key=lambda o: (OP_ORDER.index(o) if o in OP_ORDER else 99, o))
    for op in all_ops:
        for cls in ("", "accurate"):
            holders = [f for f in files if any(row_class(r) == cls for r in f["ops"].get(op, []))]
            if not holders:
                continue
            fam = FAMILY.get(op)
            named = [f for f in holders if fam and fam in f["name"].lower()]
            pool = named or holders
            chosen[(op, cls)] = max(pool, key=lambda f: (f["attrs"].get("date", ""), f["name"]))
    return chosen


def shape_of(row, op):
    key = row.get("key", "")
    prefix = op.replace("_", "-")
    if key.startswith(prefix + "-"):  # e.g. mla-prefill-naive: keep the path name
        rest = key[len(prefix) + 1:]
        head, _, tail = rest.partition(" ")
        return f"{tail} ({head})"
    if key.startswith(prefix):
        return key[len(prefix):].strip()
    return key


def table(files):
    chosen = pick_sources(files)
    header = ["op", "shape", "time", "graph step", "TB/s", "% copy", "TFLOP/s", "% matmul", "peer", "speedup", "file"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (op, cls), f in chosen.items():
        for r in (r for r in f["ops"][op] if row_class(r) == cls):
            cells = [
                op.replace("_", "-"),
                shape_of(r, op),
                fmt_time(r.get("time_ms")),
                fmt_time(r.get("graph_ms")),
                fmt_num(r.get("TBps")),
                fmt_num(r.get("pct_copy"), 2),
                fmt_num(r.get("TFLOPps")),
                fmt_num(r.get("pct_matmul"), 2),
                fmt_time(r.get("peer_ms")),
                (fmt_num(r.get("speedup_vs_peer")) + "x") if fmt_num(r.get("speedup_vs_peer")) else "",
                f["name"],
            ]
            lines.append("| " + " | ".join(cells) + " |")
    used = []
    for f in chosen.values():
        if f not in used:
            used.append(f)
    notes = [""]
    notes.append("- time: median of the timed launches (kda-decode with B <= 8: per step of a 100-step CUDA graph).")
    notes.append("- graph step: mla-decode with B <= 8, per step inside a CUDA graph of 20 steps.")
    if any(op == "kda_backward" for op, _ in chosen):
        notes.append("- kda-backward: time = the forward (kda_prefill) then the backward (kda_backward); the bench "
                     "table's fwd_ms and bwd_ms hold each alone.")
    notes.append("- % copy and % matmul: of the ceilings each file records (a device-to-device copy measured in the run;")
    notes.append("  the bf16 dense matmul peak).")
    notes.append("- peer: the time from the run's `--peer-json` file (mla-decode: an absorbed decode in plain torch,")
    notes.append("  bench/torch_mla_decode.py); speedup = peer time / time.")
    notes.append("- In mla-decode rows T is the number of cached tokens N (one decode step).")
    notes.append("- (naive): the MLA prefill that first rebuilds K and V from the latent cache with cuBLAS; the other "
                 "mla-prefill rows are the absorbed kernel.")
    if any(str(r.get("key", "")).startswith("mla-prefill-fast") for f in chosen.values() for op in f["ops"]
           for r in f["ops"][op]):
        notes.append("- (fast): the naive MLA prefill in precision fast (bf16 K, V and P, one pass per product; "
                     "docs/kernels/mla_prefill.md).")
    notes.append("")
    for f in used:
        a = f["attrs"]
        settings = ""
        try:
            cfg = json.loads(a.get("config", "{}"))
            kv = [f"{k}={strip_dirs(text(cfg[k]) if not isinstance(cfg[k], bool) else str(cfg[k]).lower())}"
                  for k in SETTINGS if k in cfg and cfg[k] not in ("", None)]
            peer = cfg.get("peer-json")
            if peer:
                peers = peer if isinstance(peer, list) else [peer]
                kv.append("peer-json=" + ",".join(strip_dirs(text(p)) for p in peers))
            settings = ", ".join(kv)
        except (ValueError, TypeError):
            settings = "(config attribute is not JSON)"
        c = f["ceilings"]
        ceil = ""
        if c:
            ceil = "; ceilings: copy {} TB/s, matmul {} TFLOP/s".format(
                fmt_num(c.get("copy_ceiling_TBps")), fmt_num(c.get("matmul_ceiling_TFLOPps")))
        ops = ", ".join(op.replace("_", "-") + (" " + cls if cls else "") for (op, cls), g in chosen.items() if g is f)
        notes.append(f"- `{f['name']}` ({ops}): `{strip_dirs(a.get('command_line', '?'))}`; settings: {settings}; "
                     f"device: {a.get('device', '?')}{ceil}; git {a.get('git_sha', '?')}; date {a.get('date', '?')}")
    return "\n".join(lines + notes) + "\n"


def rewrite_readme(path, block, begin=BEGIN, end=END):
    try:
        with open(path, encoding="utf-8") as fh:
            old = fh.read()
    except OSError as e:
        fail(f"--readme '{path}': {e}")
    i, j = old.find(begin), old.find(end)
    if i < 0 or j < 0 or j < i:
        fail(f"--readme '{path}': needs the markers {begin} and {end}, in that order")
    new = old[: i + len(begin)] + "\n\n" + block + "\n" + old[j:]
    if new != old:
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(new)
        os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description="Current-numbers table of kdalab's kernels from bench results files.")
    ap.add_argument("files", nargs="*", help="bench results files (default: data/baselines/*.h5)")
    ap.add_argument("--readme", metavar="FILE", help="rewrite the marked block of FILE instead of printing")
    ap.add_argument("--marker", metavar="NAME", default="results-table",
                    help="with --readme: the block between <!-- NAME:begin --> and <!-- NAME:end --> (default "
                         "results-table); letters, digits and '-'")
    args = ap.parse_args()
    if not re.fullmatch(r"[A-Za-z0-9-]+", args.marker):
        fail(f"--marker '{args.marker}'; accepted: letters, digits and '-'")
    if args.marker != "results-table" and not args.readme:
        fail("--marker needs --readme (it names the block of that file to rewrite)")
    paths = args.files or sorted(glob.glob("data/baselines/*.h5"))
    if not paths:
        fail("no files given and no data/baselines/*.h5 here (run from the repository root)")
    try:
        import h5py
    except ImportError:
        fail("needs h5py: run it with /usr/bin/python3 (Debian's python3-h5py)")
    files = [read_file(p, h5py) for p in paths]
    if not any(f["ops"] for f in files):
        fail("no /bench/<op> tables in the files given")
    block = table(files)
    if args.readme:
        rewrite_readme(args.readme, block, f"<!-- {args.marker}:begin -->", f"<!-- {args.marker}:end -->")
    else:
        sys.stdout.write(block)


if __name__ == "__main__":
    main()
