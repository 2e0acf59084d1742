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


def main():
    files, rows, note, grids = tr.load(__doc__.splitlines()[0], "zoology")
    if all(g.startswith("kimi") for g in grids):
        return fs.skip(f"{files[0].filename}: a Kimi Linear grid ({', '.join(sorted(grids))}): fig_train_kimi.py draws it")
    sel = rows["task"] == "mqar"
    shapes = sorted({(int(L), int(N)) for L, N in zip(rows["seq_len"][sel], rows["kv_pairs"][sel])})
    if not shapes or len(set(rows["d_model"][sel].tolist())) < 2:
        return fs.skip(f"{files[0].filename}: train_recall has no MQAR runs at two or more d_model")
    fig, axes = tr.panels(len(shapes))
    for j, (L, N) in enumerate(shapes):
        cell = sel & (rows["seq_len"] == L) & (rows["kv_pairs"] == N)
        tr.draw_panel(axes[j], rows, cell, "d_model", "model dimension d_model", f"L = {L}, N = {N}", j == 0)
    return tr.finish(fig, axes, files, "MQAR test accuracy (best lr)",
                     "Trained MQAR accuracy vs model dimension (2 layers, no MLP; Zoology Fig. 2 layout)" + note,
                     "train_recall_zoology")

if __name__ == "__main__":
    sys.exit(fs.run(main))
