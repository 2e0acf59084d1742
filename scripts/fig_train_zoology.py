#!/usr/bin/python3
"""Figure: trained MQAR accuracy vs model dimension (python -m kdalab.train_recall), Zoology's Figure 2 layout.

One panel per (sequence length L, key-value pairs N), accuracy on the test split vs d_model, one line per mixer, each
point the best of the learning rates tried (Zoology reports the best of logspace(-4, -2, 4)). Read from the
train_recall table of one results file, or without a file from every data/recall_train/*.h5 (skipped, exit 3, when
there is none). A reduced grid says so in the title ("reduced grid: N runs").
Usage: /usr/bin/python3 scripts/fig_train_zoology.py [RESULTS.h5] [--out-dir figures] [--dump FILE.json]
"""
import sys


import figstyle as fs
import train_recall_rows as tr
from figstyle import plt


def main():
    files, rows, note, grids = tr.load(__doc__.splitlines()[0])
    if all(g.startswith("kimi") for g in grids):
        return fs.skip(f"{files[0].filename}: a Kimi Linear grid ({', '.join(sorted(grids))}): fig_train_kimi.py draws it")
    sel = rows["task"] == "mqar"
    shapes = sorted({(int(L), int(N)) for L, N in zip(rows["seq_len"][sel], rows["kv_pairs"][sel])})
    if not shapes or len(set(rows["d_model"][sel].tolist())) < 2:
        return fs.skip(f"{files[0].filename}: train_recall has no MQAR runs at two or more d_model")
    fig, axes = plt.subplots(1, len(shapes), figsize=(3.3 * len(shapes) + 0.4, 3.4), squeeze=False, sharey=True)
    for j, (L, N) in enumerate(shapes):
        ax = axes[0][j]
        cell = sel & (rows["seq_len"] == L) & (rows["kv_pairs"] == N)
        for mixer in tr.mixers_in(rows, cell):
            x, y = tr.best_over_lr(rows, cell & (rows["mixer"] == mixer), "d_model")
            ax.plot(x, y, "o-", color=fs.COLORS.get(mixer, "#333333"), ms=3.5, lw=1.5,
                    label=tr.LABEL.get(mixer, mixer) if j == 0 else "_" + mixer)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("model dimension d_model")
        ax.set_ylim(-0.03, 1.03)
        ax.set_title(f"L = {L}, N = {N}")
        ax.axhline(1.0, color="#999999", lw=0.6, ls=":")
    axes[0][0].set_ylabel("MQAR test accuracy (best lr)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", fontsize=7, frameon=False, bbox_to_anchor=(1.0, 0.55))
    fig.suptitle("Trained MQAR accuracy vs model dimension (2 layers, no MLP; Zoology Fig. 2 layout)" + note, y=1.03)
    fs.label_footer(fig, files[0], tr.caption(files))
    fig.tight_layout()
    return fs.save(fig, fs._ARGS.out_dir, "train_recall_zoology")


if __name__ == "__main__":
    sys.exit(fs.run(main))
