"""Shared look of the kdalab figures (imported by scripts/fig_*.py; not a figure itself).

Every figure: h5py + matplotlib (Agg), reads one results file, is labelled with the file's git sha
and the config it was run with (root attributes), and is saved as PNG and PDF.
Exit codes of a fig_*.py script: 0 drawn, 3 the file does not hold what this figure needs
(scripts/figures.sh skips it quietly), 2 bad usage.
"""
import argparse
import json
import os
import sys
import textwrap

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


def parse_args(description):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("results", help="kdalab results file (.h5)")
    p.add_argument("--out-dir", default="figures", help="folder for the PNG and PDF (default figures/)")
    return p.parse_args()


def attr(f, name, default=""):
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


def label_footer(fig, f, extra=""):
    """Bottom-of-figure provenance line: git sha, date, command line and a short config."""
    sha = attr(f, "git_sha", "?")[:12]
    cfg = attr(f, "config", "{}")
    try:
        cfg = json.dumps(json.loads(cfg), separators=(",", ":"))
    except ValueError:
        pass
    text = f"kdalab {attr(f, 'software_version', '?')} · git {sha} · {attr(f, 'date', '?')} · seed {attr(f, 'seed', '?')}\n"
    text += textwrap.shorten("config " + cfg, width=170, placeholder=" …")
    if extra:
        text = textwrap.fill(extra, width=170) + "\n" + text
    fig.text(0.01, -0.01, text, ha="left", va="top", fontsize=6, color="#555555", family="monospace", wrap=True)


def save(fig, out_dir, name):
    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, name + ext) for ext in (".png", ".pdf")]
    for p in paths:
        fig.savefig(p)
    plt.close(fig)
    print("wrote " + " ".join(paths))
    return 0


def skip(msg):
    print("skip: " + msg, file=sys.stderr)
    return SKIP
