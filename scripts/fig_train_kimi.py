#!/usr/bin/python3
"""Figure: trained accuracy vs sequence length per task and mixer (python -m kdalab.train_recall), the layout of the
Kimi Linear report's synthetic tasks (sec. 5.1: Palindrome, MQAR, Stack).

One panel per task, accuracy on the test split vs sequence length, one line per mixer, each point the best of the
learning rates tried (the report gives the best of {5e-5, 1e-4, 5e-4, 1e-3}) at the widest d_model of the file. Read
from the train_recall table of one results file, or without a file from every data/recall_train/*.h5 (skipped,
exit 3, when there is none). A reduced grid says so in the title ("reduced grid: N runs").
Usage: /usr/bin/python3 scripts/fig_train_kimi.py [RESULTS.h5] [--out-dir figures] [--dump FILE.json]
"""
import sys

import figstyle as fs
import train_recall_rows as tr
from figstyle import plt

TASK_TITLES = {"palindrome": "Palindrome", "mqar": "MQAR", "stack": "Stack"}


def main():
    files, rows, note, grids = tr.load(__doc__.splitlines()[0])
    if all(g.startswith("zoology") for g in grids):
        return fs.skip(f"{files[0].filename}: a Zoology grid ({', '.join(sorted(grids))}): fig_train_zoology.py draws it")
    tasks = [t for t in ("palindrome", "mqar", "stack") if (rows["task"] == t).any()]
    tasks = [t for t in tasks if len(set(rows["seq_len"][rows["task"] == t].tolist())) >= 2]
    if not tasks:
        return fs.skip(f"{files[0].filename}: train_recall has no task run at two or more sequence lengths")
    fig, axes = plt.subplots(1, len(tasks), figsize=(3.3 * len(tasks) + 0.4, 3.4), squeeze=False, sharey=True)
    widths = []
    for j, task in enumerate(tasks):
        ax = axes[0][j]
        sel = rows["task"] == task
        d = rows["d_model"][sel].max()
        widths.append(int(d))
        sel = sel & (rows["d_model"] == d)
        for mixer in tr.mixers_in(rows, sel):
            x, y = tr.best_over_lr(rows, sel & (rows["mixer"] == mixer), "seq_len")
            ax.plot(x, y, "o-", color=fs.COLORS.get(mixer, "#333333"), ms=3.5, lw=1.5,
                    label=tr.LABEL.get(mixer, mixer) if j == 0 else "_" + mixer)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length L")
        ax.set_ylim(-0.03, 1.03)
        ax.set_title(f"{TASK_TITLES[task]} (d_model {int(d)})")
        ax.axhline(1.0, color="#999999", lw=0.6, ls=":")
    axes[0][0].set_ylabel("test accuracy (best lr)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", fontsize=7, frameon=False, bbox_to_anchor=(1.0, 0.55))
    fig.suptitle("Trained synthetic tasks: accuracy vs sequence length (Kimi Linear sec. 5.1 layout)" + note, y=1.03)
    fs.label_footer(fig, files[0], tr.caption(files))
    fig.tight_layout()
    return fs.save(fig, fs._ARGS.out_dir, "train_recall_kimi")


if __name__ == "__main__":
    sys.exit(fs.run(main))
