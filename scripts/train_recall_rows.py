"""The rows of python -m kdalab.train_recall's results files for fig_train_zoology.py and fig_train_kimi.py (not a
figure itself): the command line of both scripts, the train_recall table of one file or of every
data/recall_train/*.h5, the best learning rate per point, the title note of a reduced grid."""
import argparse
import glob
import os

import h5py
import numpy as np

import figstyle as fs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the checked-in results; KDALAB_RECALL_TRAIN_DIR names another folder (the tests use it)
DATA_DIR = os.environ.get("KDALAB_RECALL_TRAIN_DIR") or os.path.join(REPO, "data", "recall_train")
RUN_LABEL = "each run (× in its mixer's colour)"
LABEL = {"softmax": "softmax attention", "mla": "Gated MLA", "kda": "KDA", "gated_deltanet": "Gated DeltaNet",
         "deltanet": "DeltaNet"}
COLUMNS = ("task", "seq_len", "kv_pairs", "d_model", "mixer", "lr", "test_accuracy")


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        fs.usage_error(message)


def load(description, family=None):
    """Parses the command line (RESULTS.h5 optional; --out-dir, --dump as every figure script) and returns
    (open files, rows of all their train_recall tables as numpy arrays, title note, the set of their grid names). Without RESULTS.h5 the files
    are data/recall_train/*.h5 whose grid name starts with `family` (the figure's layout: "zoology" or "kimi"; files
    of other grids or with no train_recall table are left to the other figure); none there raises fs.Skip (exit 3)
    with the reason, and a file of the family whose table has no rows is left out. A table whose columns are not
    1-D or differ in length, a test accuracy that is not a number in [0, 1] (NaN included), a seq_len or d_model
    that is not an integer >= 1 or a kv_pairs not >= 0 (NaN included), or a task or mixer column that is not text,
    is a damaged file: one line, exit 2. The outputs (--dump, --out-dir) are checked before anything is drawn."""
    p = _Parser(description=description)
    p.add_argument("results", nargs="?", help="a results file of python -m kdalab.train_recall (default: every "
                   "data/recall_train/*.h5)")
    p.add_argument("--out-dir", default=None, help="folder for the PNG and PDF (default figures/)")
    p.add_argument("--dump", metavar="FILE.json", help="write what was drawn as JSON (see figstyle.py)")
    a = p.parse_args()
    given = a.results is not None
    if a.results is None:
        paths = sorted(glob.glob(os.path.join(DATA_DIR, "*.h5")))
        if not paths:
            fs._ARGS = a
            raise fs.Skip("no results files under data/recall_train/ (GPU runs of python -m kdalab.train_recall "
                          "are not checked in yet); give a results file")
    else:
        if not os.path.isfile(a.results):
            fs.usage_error(f"{a.results}: no such file")
        if not h5py.is_hdf5(a.results):
            fs.usage_error(f"{a.results}: not an HDF5 file (give a kdalab results file, .h5)")
        paths = [a.results]
    a.results = paths[0]
    fs._ARGS = a  # save() and run() read it
    fs._INPUTS[:] = paths
    fs.check_outputs()
    files, parts, notes, grids, devices, steps = [], [], [], set(), [], set()
    reduced = reduced_files = 0
    for path in paths:
        try:
            f = h5py.File(path, "r")
        except OSError as e:
            fs.usage_error(f"{path}: cannot read it as HDF5 ({str(e).splitlines()[0]})")
        if not given:  # every data/recall_train file: only those of this figure's grid family
            grid = fs.attr(f["train_recall"], "grid", "none") if "train_recall" in f else None
            if grid is None or (family and not grid.startswith(family)):
                continue
        try:
            t = fs.need_table(f, "train_recall", COLUMNS, path)
        except fs.Skip:
            if given:
                raise
            continue  # a data-folder file with nothing to draw does not hide the others
        shapes = {k: np.shape(t[k]) for k in COLUMNS}
        if any(len(v) > 1 for v in shapes.values()):
            fs.usage_error(f"{path}: the train_recall columns are not 1-D ("
                           f"{', '.join(f'{k} {v}' for k, v in shapes.items() if len(v) > 1)}); a damaged file")
        lengths = {k: len(np.atleast_1d(t[k])) for k in COLUMNS}
        if len(set(lengths.values())) != 1:
            fs.usage_error(f"{path}: the train_recall columns differ in length "
                           f"({', '.join(f'{k} {n}' for k, n in lengths.items())}); a damaged file")
        try:
            acc = np.atleast_1d(t["test_accuracy"]).astype(float)
        except (TypeError, ValueError):
            fs.usage_error(f"{path}: train_recall test_accuracy is not numeric; a damaged file")
        bad = int((~(np.isfinite(acc) & (acc >= 0) & (acc <= 1))).sum())
        if bad:
            fs.usage_error(f"{path}: train_recall test_accuracy holds {bad} value(s) outside [0, 1] (NaN or inf "
                           "included); a damaged file")
        # the panels and axes come from these: whole numbers (kv_pairs 0 for the tasks without pairs) and text
        for k, lo in (("seq_len", 1), ("d_model", 1), ("kv_pairs", 0)):
            try:
                v = np.atleast_1d(t[k]).astype(float)
            except (TypeError, ValueError):
                fs.usage_error(f"{path}: train_recall {k} is not numeric; a damaged file")
            bad = int((~(np.isfinite(v) & (v >= lo) & (v == np.floor(v)))).sum())
            if bad:
                fs.usage_error(f"{path}: train_recall {k} holds {bad} value(s) that are not integers >= {lo} (NaN "
                               "or inf included); a damaged file")
        for k in ("task", "mixer"):
            if np.atleast_1d(t[k]).dtype.kind != "U":
                fs.usage_error(f"{path}: train_recall {k} is not text; a damaged file")
        files.append(f)
        parts.append({k: np.atleast_1d(t[k]) for k in COLUMNS})
        try:  # the training length, for the title (a file without a numeric steps column just says nothing)
            steps.update(int(x) for x in np.atleast_1d(np.asarray(t.get("steps", []), dtype=float)) if np.isfinite(x))
        except (TypeError, ValueError):
            pass
        grids.add(fs.attr(f["train_recall"], "grid", "none"))
        note = fs.attr(f["train_recall"], "note", "")
        trained_on = fs.attr(f["train_recall"], "torch_device", "")
        if trained_on and trained_on not in devices:
            devices.append(trained_on)
        if note.startswith("reduced grid"):
            reduced += len(acc)
            reduced_files += 1
    if not files:
        raise fs.Skip(f"no results file of a {family} grid under data/recall_train/; give a results file")
    rows = {k: np.concatenate([p[k] for p in parts]) for k in COLUMNS}
    # one title note for every file: "reduced grid: N runs" (summed over the files of reduced grids), the cards
    if reduced:
        notes.insert(0, f"reduced grid: {reduced} runs" + (f" in {reduced_files} files" if reduced_files > 1 else "")
                     + (f" (and {len(files) - reduced_files} file(s) of a full grid)" if reduced_files < len(files)
                        else ""))
    if len(steps) == 1:  # every run trained as long: a reader must know it (short runs may not have converged)
        notes.append(f"{steps.pop()} steps a run")
    if devices:
        unknown = sum(1 for f in files if not fs.attr(f["train_recall"], "torch_device", ""))
        notes.append("trained on " + ", ".join(devices) + (f" ({unknown} file(s) name no card)" if unknown else ""))
    return files, rows, (" — " + "; ".join(notes)) if notes else "", grids


def mixers_in(rows, sel):
    """The mixers of the selected rows in the figure order (softmax, mla, kda, gated_deltanet, deltanet, others)."""
    present = list(dict.fromkeys(rows["mixer"][sel].tolist()))
    order = [m for m in LABEL if m in present]
    return order + [m for m in present if m not in order]


def best_over_lr(rows, sel, x_key):
    """x values and, for each, the best test accuracy over the learning rates (and files) of the selected rows."""
    xs = sorted(set(rows[x_key][sel].tolist()))
    ys = [rows["test_accuracy"][sel & (rows[x_key] == x)].max() for x in xs]
    return np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)


def shown_name(path):
    """A results file as the footer names it: relative to the repository when it lies inside (never this machine's
    folders), else as given."""
    rel = os.path.relpath(os.path.realpath(path), os.path.realpath(REPO))
    return path if rel.startswith("..") else rel


def caption(files):
    names = ", ".join(os.path.basename(f.filename) for f in files)
    first = "" if len(files) == 1 else " (per file)"
    return (f"Each point: the best test accuracy over the learning rates tried, each cross one run (files: {names}); "
            f"training settings in the config below{first} and docs/recall-training.md.")


def panels(n):
    """A row of n panels sharing the accuracy axis."""
    fig, axes = fs.plt.subplots(1, n, figsize=(3.3 * n + 0.4, 3.4), squeeze=False, sharey=True)
    return fig, axes[0]


def draw_panel(ax, rows, sel, x_key, xlabel, title, first):
    """One panel: per mixer of the selected rows, the best test accuracy over the learning rates against x_key
    (log2 axis), and each run's own accuracy as a faint cross (how far the learning rates apart: recurrent mixers
    learn recall in a narrow window); the legend labels come from the first panel only."""
    for k, mixer in enumerate(mixers_in(rows, sel)):
        m = sel & (rows["mixer"] == mixer)
        color = fs.COLORS.get(mixer, "#333333")
        x, y = best_over_lr(rows, m, x_key)
        ax.plot(x, y, "o-", color=color, ms=3.5, lw=1.5, label=LABEL.get(mixer, mixer) if first else "_" + mixer)
        ax.plot(rows[x_key][m].astype(float), rows["test_accuracy"][m].astype(float), "x", color=color, ms=4,
                alpha=0.45, lw=0, label="_runs " + mixer)
    if first:  # one legend entry for the crosses of every mixer, in a neutral grey
        ax.plot([], [], "x", color="#888888", ms=4, lw=0, label=RUN_LABEL)
    ax.set_xscale("log", base=2)
    xs = sorted(set(rows[x_key][sel].astype(float).tolist()))
    ax.set_xticks(xs)  # ticks only where runs are (a reduced grid leaves values out)
    ax.set_xticklabels([f"$2^{{{int(np.log2(x))}}}$" if x > 0 and float(np.log2(x)).is_integer() else f"{x:g}"
                        for x in xs])
    ax.minorticks_off()
    ax.set_xlabel(xlabel)
    ax.set_ylim(-0.03, 1.03)
    ax.set_title(title)
    ax.axhline(1.0, color="#999999", lw=0.6, ls=":")


def finish(fig, axes, files, ylabel, title, name):
    """The shared axis label, one legend for every panel, the title, the footer; saves the figure as `name`."""
    axes[0].set_ylabel(ylabel)
    handles, labels = axes[0].get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda i: labels[i] == RUN_LABEL)  # the mixers first
    handles, labels = [handles[i] for i in order], [labels[i] for i in order]
    fig.legend(handles, labels, loc="center left", fontsize=7, frameon=False, bbox_to_anchor=(1.0, 0.55))
    fig.suptitle(title, y=1.03)
    fs.label_footer(fig, files[0], caption(files), shown=shown_name(files[0].filename),
                    also=[(shown_name(f.filename), f) for f in files[1:]])
    fig.tight_layout()
    return fs.save(fig, fs._ARGS.out_dir, name)
