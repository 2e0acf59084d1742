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

TASK_TITLES = {"palindrome": "Palindrome", "mqar": "MQAR", "stack": "Stack"}


def main():
    files, rows, note, grids = tr.load(__doc__.splitlines()[0], "kimi")
    if all(g.startswith("zoology") for g in grids):
        return fs.skip(f"{files[0].filename}: a Zoology grid ({', '.join(sorted(grids))}): fig_train_zoology.py draws it")
    tasks = [t for t in ("palindrome", "mqar", "stack") if (rows["task"] == t).any()]
    tasks = [t for t in tasks if len(set(rows["seq_len"][rows["task"] == t].tolist())) >= 2]
    if not tasks:
        return fs.skip(f"{files[0].filename}: train_recall has no task run at two or more sequence lengths")
    fig, axes = tr.panels(len(tasks))
    for j, task in enumerate(tasks):
        sel = rows["task"] == task
        d = rows["d_model"][sel].max()
        sel = sel & (rows["d_model"] == d)
        tr.draw_panel(axes[j], rows, sel, "seq_len", "sequence length L", f"{TASK_TITLES[task]} (d_model {int(d)})",
                      j == 0)
    return tr.finish(fig, axes, files, "test accuracy (best lr)",
                     "Trained synthetic tasks: accuracy vs sequence length (Kimi Linear sec. 5.1 layout)" + note,
                     "train_recall_kimi")

if __name__ == "__main__":
    sys.exit(fs.run(main))
