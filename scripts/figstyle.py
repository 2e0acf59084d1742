"""Shared look of the kdalab figures (imported by scripts/fig_*.py; not a figure itself).

Every figure: h5py + matplotlib (Agg), reads one results file, is labelled with the file's git sha
and the config it was run with (root attributes), and is saved as PNG and PDF.
Exit codes of a fig_*.py script: 0 drawn, 3 the file does not hold what this figure needs (no such table,
a missing column, no rows; "skip: <why>" on stderr; scripts/figures.sh skips it quietly), 2 bad usage (one
line "<script>: error: <why>" on stderr: a bad option, a missing path, a file that is not HDF5 or cannot be read).
A script's main() runs through run(), which turns Skip into exit 3 and an unreadable file into exit 2, so no
odd file ends in a traceback.
`--dump FILE.json` writes what was drawn (per axes: title, scales, limits, every line with its
label, style and data, the texts and where they sit; the legends; the footer text), for tests and for checking a
figure without looking at it. With --dump alone only the JSON is written (no figure in figures/ is redrawn behind
the user's back); with --dump and --out-dir DIR the PNG and PDF go to DIR as well. Every file written is named
on stdout ("wrote ..."). The outputs are checked before anything is drawn (check_outputs): the dump is never a
results file the figure reads nor any HDF5 file, its folder exists, --out-dir is a folder or can become one; bad
ones are one line, exit 2, nothing written. A write that fails anyway names its output, exit 5.
"""
import argparse
import json
import os
import re
import sys
import textwrap

import h5py
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

SKIP = 3

plt.rcParams.update({
    "font.size": 9, "axes.titlesize": 10, "axes.labelsize": 9, "legend.fontsize": 7.5,
    "xtick.labelsize": 8, "ytick.labelsize": 8, "axes.grid": True, "grid.alpha": 0.3,
    "axes.spines.top": False, "axes.spines.right": False, "savefig.bbox": "tight", "figure.dpi": 150,
})

COLORS = {
    "softmax": "#000000", "mla": "#7f7f7f", "linear": "#d62728", "gla": "#ff7f0e",
    "deltanet": "#1f77b4", "gated_deltanet": "#9467bd", "kda": "#2ca02c",
}
LABELS = {
    "softmax": "softmax", "mla": "MLA (latent)", "linear": "linear attention", "gla": "GLA",
    "deltanet": "DeltaNet", "gated_deltanet": "Gated DeltaNet", "kda": "KDA",
}


_ARGS = None
_INPUTS = []  # the results files a figure reads (parse_args, or a script that reads several): never an output


def parse_args(description):
    """The command line every fig_*.py takes: the results file, --out-dir (default figures/; None when not given)
    and --dump FILE.json (then the figure is written only when --out-dir is given: see save()). `description` is
    the script's --help text. Returns the argparse namespace (also kept for save()); argparse exits 2 on bad
    usage."""
    global _ARGS
    p = argparse.ArgumentParser(description=description)
    p.add_argument("results", help="kdalab results file (.h5)")
    p.add_argument("--out-dir", default=None, help="folder for the PNG and PDF (default figures/; with --dump, "
                   "the figure is drawn only when --out-dir is given)")
    p.add_argument("--dump", metavar="FILE.json", help="write what was drawn as JSON (axes limits and scales, "
                   "lines with label, style and data, texts, legends, footer text) instead of the figure; add "
                   "--out-dir DIR to write the figure too")
    _ARGS = p.parse_args()
    if not os.path.isfile(_ARGS.results):
        usage_error(f"{_ARGS.results}: no such file" if not os.path.exists(_ARGS.results)
                    else f"{_ARGS.results}: not a file")
    if not h5py.is_hdf5(_ARGS.results):
        usage_error(f"{_ARGS.results}: not an HDF5 file (give a kdalab results file, .h5)")
    _INPUTS[:] = [_ARGS.results]
    check_outputs()
    return _ARGS


def check_outputs():
    """The outputs of --dump and --out-dir, checked before anything is drawn or written (one line, exit 2): the
    dump is a file name in an existing folder, never one of the results files read (_INPUTS) nor any other HDF5
    file; --out-dir is a folder or a name that can become one (its parent exists)."""
    a = _ARGS
    if a is None:
        return
    ins = {os.path.realpath(p) for p in _INPUTS}
    if a.dump is not None:
        folder = os.path.dirname(a.dump) or "."
        if os.path.isdir(a.dump):
            usage_error(f"--dump {a.dump} is a folder; accepted: a file name (FILE.json)")
        if not os.path.isdir(folder):
            usage_error(f"--dump {a.dump}: folder '{folder}' does not exist; create it first")
        if os.path.realpath(a.dump) in ins:
            usage_error(f"--dump {a.dump} is a results file this figure reads; accepted: another file (FILE.json)")
        if os.path.isfile(a.dump) and h5py.is_hdf5(a.dump):
            usage_error(f"--dump {a.dump} is an HDF5 file; accepted: a JSON file name (an HDF5 file is never replaced)")
    if a.out_dir is not None:
        if os.path.exists(a.out_dir) and not os.path.isdir(a.out_dir):
            usage_error(f"--out-dir {a.out_dir} is not a folder; accepted: a folder (made when missing)")
        parent = os.path.dirname(os.path.abspath(a.out_dir))
        if not os.path.isdir(a.out_dir) and not os.path.isdir(parent):
            usage_error(f"--out-dir {a.out_dir}: its parent folder '{parent}' does not exist")


def usage_error(msg):
    """Bad usage: prints one line "<script>: error: <msg>" on stderr and exits 2 (no traceback, no figure)."""
    print(f"{os.path.basename(sys.argv[0])}: error: {msg}", file=sys.stderr)
    sys.exit(2)


class Skip(Exception):
    """Raised (by need_table() or a script) when the file does not hold what the figure needs; run() turns it
    into skip(message), exit 3."""


def need_table(f, group, columns=(), path=None):
    """The columns of the table group `group` of the open file `f` (as table()), checked for what a figure
    needs: the group exists, holds every name in `columns`, and has at least one row. Raises Skip naming the
    file (`path`, default f.filename), the group and what is missing ("has no <group> table", "<group> has no
    column(s) a, b", "<group> has no rows") otherwise."""
    path = path or f.filename
    if group not in f or not isinstance(f[group], h5py.Group):
        raise Skip(f"{path} has no {group} table")
    t = table(f, group)
    missing = [c for c in columns if c not in t]
    if missing:
        raise Skip(f"{path}: {group} has no column(s) {', '.join(missing)}")
    if not t or min(len(np.atleast_1d(v)) for v in t.values()) == 0:
        raise Skip(f"{path}: {group} has no rows")
    return t


def optional_table(f, group, columns=()):
    """need_table() for a table a figure draws only when present: its columns, or None when the group is absent,
    lacks one of `columns` or has no rows."""
    try:
        return need_table(f, group, columns)
    except Skip:
        return None


def run(main):
    """Runs a figure script's main() and returns its exit code: main()'s own (0 drawn, 3 skipped), 3 with
    "skip: <why>" when it raises Skip, 2 with one line "<script>: error: <why>" when the results file cannot be
    read (OSError from h5py: a truncated or unreadable file)."""
    try:
        return main()
    except Skip as e:
        return skip(str(e))
    except OSError as e:
        usage_error(f"cannot read {_ARGS.results if _ARGS is not None else 'the results file'}: {e}")


def attr(f, name, default=""):
    """Attribute `name` of an h5py file, group or dataset `f` as text (bytes decoded, numbers str()'d);
    `default` when absent."""
    v = f.attrs.get(name, default)
    return v.decode() if isinstance(v, bytes) else str(v)


def table(f, group):
    """Columns of a table group as a dict of numpy arrays (strings decoded)."""
    g = f[group]
    out = {}
    for k, ds in g.items():
        if not hasattr(ds, "shape"):
            continue
        a = ds[()]
        if a.dtype.kind in ("O", "S"):
            a = np.array([x.decode() if isinstance(x, bytes) else str(x) for x in a])
        out[k] = a
    return out


def _num(x):
    """A JSON number as the results files store it: an integral value as an integer (16, not 16.0),
    any other with the shortest digits that read back to the same double (0.02, -5.46)."""
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e15:
        return str(int(x))
    return repr(x)


def _option_value(v):
    """An option value as the command line takes it and the root `config` attribute stores it:
    lists as [a,b,c] (strings unquoted), numbers by _num."""
    if isinstance(v, list):
        return "[" + ",".join(_option_value(x) for x in v) + "]"
    if isinstance(v, (int, float)):
        return _num(v)
    if v is None:
        return "null"
    return str(v)


# Run-control options: where the file went (out), whether progress was shown (quiet), overwrite (force, never
# recorded). They do not change a number, so a footer leaves them out. --quick does change the grid, but every
# value it sets is recorded under its own key (the root `config` and the groups' `options` hold the values used
# after --quick), so the footer shows its effect and leaves the flag out too.
RUN_CONTROL = ("out", "quick", "quiet", "force")


def format_config(cfg, drop=()):
    """The config JSON text (root `config` or a group's `options`) as `key=value` pairs in the form the
    command line takes (`d-k=[16,32,64] g-min=[-5] keys=[random,orthogonal]`): integral numbers print as
    integers, never 16.0; keys listed in `drop` (e.g. RUN_CONTROL) are left out; text that is not a JSON
    object is returned unchanged."""
    try:
        obj = json.loads(cfg)
    except ValueError:
        return cfg
    if not isinstance(obj, dict):
        return cfg
    return " ".join(f"{k}={_option_value(v)}" for k, v in obj.items() if k not in drop)


def is_quick(f):
    """Whether the results file `f` (open h5py file) was written by a --quick run: its root `config` records
    "quick": true (kdalab stores the flag as a JSON boolean)."""
    try:
        cfg = json.loads(attr(f, "config", "{}"))
    except ValueError:
        return False
    return isinstance(cfg, dict) and cfg.get("quick") is True


QUICK_TITLE = " (--quick run)"  # appended by save() to the title of a figure drawn from a --quick run


def gpu_name(f, default="GPU"):
    """The first GPU's name in the root `device` attribute of the results file `f` ("CPU: ...; GPU: NVIDIA H200
    (sm_90, ...)" -> "NVIDIA H200"): the device the file's GPU rows were measured on. `default` when none is named."""
    for part in attr(f, "device", "").split("; "):
        if part.startswith("GPU: "):
            return part[len("GPU: "):].split(" (")[0].strip() or default
    return default


def short_sha(sha):
    """A git_sha attribute as the footer shows it: the commit's first 12 hex digits, with its "-dirty" mark kept (a
    build from a tree with changes must not read as the clean commit)."""
    base, mark = (sha[:-len("-dirty")], "-dirty") if sha.endswith("-dirty") else (sha, "")
    return base[:12] + mark


def compact_command(cmd):
    """A command line with each run of three or more arguments that differ only in one integer counting up by one (a
    merge's shard files: f-shard-1-of-54.h5 ... f-shard-54-of-54.h5) written as one shell brace range,
    f-shard-{1..54}-of-54.h5, which the shell expands back to the same arguments: the footer stays the whole record,
    in a few lines. Numbers with a leading zero are left as they are (a brace range would drop the zero)."""
    words = cmd.split(" ")
    parts = [re.split(r"(\d+)", w) for w in words]

    def next_of(a, b):  # the digit field k where b is a with that field one larger, else None
        if len(a) != len(b):
            return None
        diff = [k for k in range(len(a)) if a[k] != b[k]]
        if len(diff) != 1 or diff[0] % 2 == 0:
            return None
        k = diff[0]
        ok = not a[k].startswith("0") and not b[k].startswith("0") and int(b[k]) == int(a[k]) + 1
        return k if ok else None

    out, i = [], 0
    while i < len(words):
        k = next_of(parts[i], parts[i + 1]) if i + 1 < len(words) else None
        j = i + 1
        if k is not None:
            while j < len(words) and next_of(parts[j - 1], parts[j]) == k:
                j += 1
        if j - i >= 3:
            p = parts[i]
            out.append("".join(p[:k]) + f"{{{p[k]}..{parts[j - 1][k]}}}" + "".join(p[k + 1:]))
            i = j
        else:
            out.append(words[i])
            i += 1
    return " ".join(out)


def label_footer(fig, f, extra="", group=None, shown=None, also=()):
    """Bottom-of-figure provenance: the results file drawn ("drawn from <path>", the path as given, or `shown`), kdalab
    version, git sha, date, seed and the config (the group's `options` attribute, the values actually used after
    --quick, when present; else the root config) without the run-control options (RUN_CONTROL: out, quick, quiet, force), then the
    command line. `extra`: a caption printed above; `group`: the group whose `options` to show (default: the
    first group that has them). A file written by a --quick run (is_quick) also gets QUICK_TITLE after the
    figure's title when save() writes it. Every part is wrapped onto as many lines as it needs at the figure's
    width (never cut with "..."); call it before fig.tight_layout() or after, the footer hangs below the figure
    and savefig's tight bbox takes it in. `also`: (name, open file) pairs of further files drawn in the same figure,
    each given its own provenance lines after the first file's."""
    fig._kdalab_quick = is_quick(f)
    sha = short_sha(attr(f, "git_sha", "?"))
    cfg = attr(f, "config", "{}")
    if group is None:
        for g in f:
            if "options" in f[g].attrs:
                group = g
                break
    if group is not None and group in f and "options" in f[group].attrs:
        cfg = attr(f[group], "options", cfg)
    cfg = format_config(cfg, drop=RUN_CONTROL)
    # As many characters as the figure is wide (6 pt monospace: ~3.6 pt a character), never fewer than 100;
    # every line is wrapped whole, never cut: the footer is the record of what was run.
    width = max(100, int(fig.get_figwidth() * 72 / FOOTER_CHAR_PT))
    text = "\n".join(textwrap.wrap("drawn from " + (shown or f.filename), width=width, subsequent_indent="  ", break_on_hyphens=False))
    text += f"\nkdalab {attr(f, 'software_version', '?')} · git {sha} · {attr(f, 'date', '?')} · seed {attr(f, 'seed', '?')}\n"
    text += "\n".join(textwrap.wrap("config " + cfg, width=width, subsequent_indent="  ", break_on_hyphens=False,
                                     break_long_words=True))
    if extra:
        text = textwrap.fill(extra, width=width) + "\n" + text
    text += "\n" + "\n".join(textwrap.wrap("command: " + compact_command(attr(f, "command_line", "")), width=width,
                                           subsequent_indent="  ", break_on_hyphens=False))
    for name, g in also:
        line = (f"and {name}: kdalab {attr(g, 'software_version', '?')} · git {short_sha(attr(g, 'git_sha', '?'))} · "
                f"{attr(g, 'date', '?')} · seed {attr(g, 'seed', '?')} · config {format_config(attr(g, 'config', '{}'), drop=RUN_CONTROL)} · "
                f"command: {compact_command(attr(g, 'command_line', ''))}")
        text += "\n" + "\n".join(textwrap.wrap(line, width=width, subsequent_indent="  ", break_on_hyphens=False,
                                                break_long_words=True))
    fig.text(0.01, -0.01, text, ha="left", va="top", fontsize=FOOTER_PT, color="#555555", family="monospace")


FOOTER_PT = 6
FOOTER_CHAR_PT = 0.6 * FOOTER_PT  # the advance of a DejaVu Sans Mono character, in points


def panel_note(ax, text, fontsize=6):
    """Writes a note about a panel (e.g. "GPU rows skipped: ...") under the panel, below its x-axis label, where no
    data can be: left-aligned with the axes, wrapped to the axes' width, grey; a newline in `text` starts a new line
    (each line wrapped on its own, so several notes stay apart). Returns the text artist (an annotation placed in
    points below the x label, so it moves with the label under tight_layout)."""
    fig = ax.figure
    w_in = ax.get_position().width * fig.get_figwidth()
    width = max(30, int(w_in * 72 / (0.55 * fontsize)))  # ~0.55 em a character (DejaVu Sans)
    wrapped = "\n".join("\n".join(textwrap.wrap(p, width=width)) for p in text.split("\n"))
    return ax.annotate(wrapped, xy=(0.0, 0.0),
                       xycoords=("axes fraction", ax.xaxis.label), xytext=(0, -3), textcoords="offset points",
                       ha="left", va="top", fontsize=fontsize, color="#777777", annotation_clip=False)


def clear_legend_headroom(ax, legend, margin=0.03):
    """Raises the top of the y axis of `ax` until every finite data point of its lines (those drawn in data
    coordinates; axhline/axvline are left out) lies at least `margin` (axes fraction) below the bottom of `legend`,
    a legend placed at the top of the axes: the curves keep their shape and no longer run under the legend. A log
    axis stays log (the new top is found in decades). Call after fig.tight_layout() (the legend's height in axes
    fractions depends on the axes' final size). Does nothing when the data are already clear of it."""
    ax.figure.canvas.draw()
    box = _axes_box(ax, legend)
    ys = [np.asarray(ln.get_ydata(), dtype=float) for ln in ax.get_lines() if ln.get_transform() == ax.transData]
    ys = np.concatenate(ys) if ys else np.array([])
    ys = ys[np.isfinite(ys)]
    lo, hi = ax.get_ylim()
    to = np.log10 if ax.get_yscale() == "log" else (lambda v: v)
    if ax.get_yscale() == "log":
        ys = ys[ys > 0]
    target = box[1] - margin  # the highest axes fraction a data point may reach
    if ys.size == 0 or target <= 0:
        return
    top = to(ys.max())
    if (top - to(lo)) / (to(hi) - to(lo)) <= target:
        return
    new_hi = to(lo) + (top - to(lo)) / target
    ax.set_ylim(lo, 10 ** new_hi if ax.get_yscale() == "log" else new_hi)


def _jsonable(a):
    """An array as a flat list of floats for JSON, NaN/Inf as None (null)."""
    a = np.asarray(a, dtype=float).ravel()
    return [None if not np.isfinite(x) else float(x) for x in a]


def _axes_box(ax, t):
    """The drawn extent of text `t` in the axes fractions of `ax` ([x0, y0, x1, y1]; inside the axes is 0..1)."""
    bb = t.get_window_extent(renderer=ax.figure.canvas.get_renderer())
    (x0, y0), (x1, y1) = ax.transAxes.inverted().transform([[bb.x0, bb.y0], [bb.x1, bb.y1]])
    return [float(x0), float(y0), float(x1), float(y1)]


def describe(fig):
    """What the figure shows, as plain data (the --dump output): per axes its title, labels, scales,
    limits, lines (label, color, linestyle, marker, markersize, markerfacecolor, linewidth, zorder,
    x, y, coords), legend texts and the legend's box, texts and their boxes in axes fractions; the figure-level legends and texts (the
    footer). Call after fig.canvas.draw()."""
    axes = []
    for ax in fig.axes:
        lines = []
        for ln in ax.get_lines():
            lines.append({"label": ln.get_label(), "color": matplotlib.colors.to_hex(ln.get_color()),
                          "linestyle": ln.get_linestyle(), "marker": str(ln.get_marker()),
                          "markersize": float(ln.get_markersize()),
                          "markerfacecolor": str(ln.get_markerfacecolor()), "linewidth": float(ln.get_linewidth()),
                          "zorder": float(ln.get_zorder()), "x": _jsonable(ln.get_xdata()), "y": _jsonable(ln.get_ydata()),
                          # "axes" for axhline/axvline, whose other coordinate is a fraction of the axes
                          "coords": "data" if ln.get_transform() == ax.transData else "axes"})
        leg = ax.get_legend()
        axes.append({"title": ax.get_title(), "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(),
                     "xscale": ax.get_xscale(), "yscale": ax.get_yscale(), "xlim": list(map(float, ax.get_xlim())),
                     "ylim": list(map(float, ax.get_ylim())), "lines": lines,
                     "legend": [t.get_text() for t in leg.get_texts()] if leg else [],
                     # the legend's frame in axes fractions [x0, y0, x1, y1] (outside 0..1: beside the axes); [] if none
                     "legend_box": _axes_box(ax, leg) if leg else [],
                     "texts": [t.get_text() for t in ax.texts],
                     # where each text sits, in axes fractions [x0, y0, x1, y1] (0..1 inside the axes): after a draw
                     "text_boxes": [_axes_box(ax, t) for t in ax.texts]})
    return {"axes": axes, "legends": [[t.get_text() for t in lg.get_texts()] for lg in fig.legends],
            "texts": [t.get_text() for t in fig.texts],
            "suptitle": fig._suptitle.get_text() if getattr(fig, "_suptitle", None) is not None else ""}


def save(fig, out_dir, name):
    """Writes `fig` as <out_dir>/<name>.png and .pdf (creating out_dir) and/or the --dump JSON (describe()),
    first appending QUICK_TITLE to the figure's title (the suptitle, else the first panel's title) when
    label_footer() found the file to be from a --quick run; closes the figure and prints every path written ("wrote a b c"). `out_dir` None (no --out-dir given):
    figures/ without --dump; with --dump only the JSON is written (the user asked for the dump, not for a figure
    in figures/ to be redrawn). Returns 0, the "drawn" exit code."""
    dump = _ARGS.dump if _ARGS is not None else None
    if getattr(fig, "_kdalab_quick", False):  # label_footer() saw a --quick run: the title says so
        titled = fig._suptitle if getattr(fig, "_suptitle", None) is not None else (fig.axes[0].title if fig.axes else None)
        if titled is not None and not titled.get_text().endswith(QUICK_TITLE):
            titled.set_text(titled.get_text() + QUICK_TITLE)
    written = []
    if out_dir is None and not dump:
        out_dir = "figures"
    images = [os.path.join(out_dir, name + ext) for ext in (".png", ".pdf")] if out_dir is not None else []
    check_outputs()
    for p in images:  # every target checked before the first is written
        if os.path.isdir(p):
            usage_error(f"{p} is a folder; accepted: --out-dir a folder where {name}.png and .pdf can be written")
    try:
        if dump:
            fig.canvas.draw()  # limits and tight_layout as saved
            text = json.dumps(describe(fig), indent=1)
            with open(dump, "w") as fh:
                fh.write(text)
            written.append(dump)
        if out_dir is not None:
            os.makedirs(out_dir, exist_ok=True)
            for p in images:
                fig.savefig(p)
                written.append(p)
    except OSError as e:  # the environment (no space, permission, I/O): one line naming the output, exit 5
        print(f"{os.path.basename(sys.argv[0])}: error: cannot write {e.filename or 'an output'}: {e.strerror or e}"
              + (f" (written before it: {' '.join(written)})" if written else ""), file=sys.stderr)
        sys.exit(5)
    plt.close(fig)
    print("wrote " + " ".join(written) + ("" if out_dir is not None else
                                          f" (the dump only: add --out-dir DIR to draw {name}.png/.pdf too)"))
    return 0


def skip(msg):
    """Says why this figure is not drawn ("skip: <msg>" on stderr) and returns SKIP (exit code 3: the file does
    not hold what the figure needs; scripts/figures.sh skips it quietly)."""
    print("skip: " + msg, file=sys.stderr)
    return SKIP


# ---- curves that lie on each other ----
# Two curves of a panel whose points all coincide would hide one under the other. overlay_groups() finds such
# groups; overlay_style() draws the first of a group underneath (large open marker, thick line) and each further one on
# top (smaller marker of another shape, thinner dashed/dotted line); lies_on() is the legend note ("lies on X") that
# says which curve a series lies on. Used by fig_parity.py (medians on a log axis) and fig_recall.py (accuracy on a
# linear axis, error on a log axis); any fig_*.py with several curves in one panel can use them the same way.
COINCIDE = 0.02  # default: two curves coincide when every point differs by less than 2% (relative)
OVERLAY_MARKERS = ["o", "s", "D", "^", "v", "P", "X", "*"]
OVERLAY_LINESTYLES = ["-", "--", ":", "-."]


def curves_coincide(xa, ya, xb, yb, rel=COINCIDE, abs_tol=0.0, need_finite=True):
    """Whether two curves (x, y arrays) lie on each other: the same x values, finite at the same points (NaN/Inf
    breaks a line: not drawn there), at least one finite point (unless `need_finite` is False: then two curves with no
    finite point coincide too, e.g. when both draw markers elsewhere at the same x), and every finite pair within
    max(rel * max(|ya|, |yb|), abs_tol). `rel` suits a log axis, `abs_tol` (in data units) a linear one."""
    xa, xb = np.asarray(xa, dtype=float), np.asarray(xb, dtype=float)
    ya, yb = np.asarray(ya, dtype=float), np.asarray(yb, dtype=float)
    if xa.shape != xb.shape or not np.array_equal(xa, xb) or ya.shape != yb.shape:
        return False
    fa, fb = np.isfinite(ya), np.isfinite(yb)
    if not np.array_equal(fa, fb) or (need_finite and not fa.any()):
        return False
    a, b = ya[fa], yb[fa]
    return bool(np.all(np.abs(a - b) <= np.maximum(rel * np.maximum(np.abs(a), np.abs(b)), abs_tol)))


def recall_variants(t, base, mem, gm, dk):
    """The curves of memory `mem` that the recall figures draw from the recall/capacity rows `base` (a mask of the
    table `t`): [(mask, line style, label)]; beta = 1 for the delta-rule memories, g_min = gm for the gated ones, MLA
    twice (d_c = d_k + d_v solid, (d_k + d_v) / 2 dashed). dk: d_k, a scalar or the column t["d_k"]."""
    if mem in ("deltanet", "gated_deltanet", "kda"):
        base = base & (t["beta"] == 1.0)
    if mem in ("gla", "gated_deltanet", "kda"):
        base = base & (t["g_min"] == gm)
    if mem == "mla":
        return [(base & (t["d_c"] == 2 * dk), "-", "MLA, $d_c = d_k + d_v$"),
                (base & (t["d_c"] == dk), "--", "MLA, $d_c = (d_k + d_v)/2$")]
    return [(base, "-", LABELS[mem])]


def overlay_groups(curves, rel=COINCIDE, abs_tol=0.0, first=None, same=None, need_finite=True):
    """Groups of coinciding curves: `curves` is a list of (x, y); returns a list of lists of indices (every index in
    exactly one group, groups in the order of their first member). A curve joins the first group whose first curve it
    coincides with (curves_coincide with `rel`, `abs_tol`, `need_finite`, and `same(i, j)` when given: a further
    condition of the caller's). Within a group the curves are sorted by `first(index)` (default: their index): the
    first is drawn underneath, the others on top of it."""
    groups = []
    for k, (x, y) in enumerate(curves):
        for g in groups:
            if (curves_coincide(curves[g[0]][0], curves[g[0]][1], x, y, rel, abs_tol, need_finite)
                    and (same is None or same(g[0], k))):
                g.append(k)
                break
        else:
            groups.append([k])
    for g in groups:
        g.sort(key=first if first is not None else (lambda k: k))
    return groups


def overlay_style(rank, size, color, ls="-", ms=3.5, lw=1.5):
    """Plot keywords (ls, marker, ms, lw, mfc, mew, zorder) for the curve of `rank` (0 = first) in a group of `size`
    coinciding curves of colour `color`. A curve alone (size 1) keeps its own line style `ls`, a round filled marker
    `ms` and width `lw`; in a group the first is drawn underneath with its own `ls`, a large open marker and a thick
    line, each further one on top with a smaller filled marker of another shape and a thinner dashed/dotted line, so
    every curve of the group stays visible."""
    if size <= 1:
        return dict(ls=ls, marker="o", ms=ms, lw=lw, mfc=color, zorder=2)
    if rank == 0:
        return dict(ls=ls, marker=OVERLAY_MARKERS[0], ms=9.0, lw=2.8, mfc="none", mew=1.2, zorder=2)
    return dict(ls=OVERLAY_LINESTYLES[rank % len(OVERLAY_LINESTYLES)], marker=OVERLAY_MARKERS[rank % len(OVERLAY_MARKERS)],
                ms=max(2.5, 9.0 - 5.0 * rank ** 0.5), lw=max(0.8, 2.8 - 1.0 * rank), mfc=color, mew=1.2, zorder=2 + rank)


def lies_on(label):
    """The legend note of a curve drawn on top of another it coincides with: "lies on <label>"."""
    return f"lies on {label}"
