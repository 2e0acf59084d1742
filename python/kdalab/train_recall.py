"""Trained associative recall: small models trained on Zoology's MQAR and the Kimi Linear report's synthetic tasks
(Palindrome, MQAR, Stack), with softmax attention, Gated MLA, KDA, Gated DeltaNet or DeltaNet as the sequence mixer
(docs/recall-training.md).

    python -m kdalab.train_recall [--grid NAME] [options] --out FILE.h5

The data come from kdalab's C++ generators (numerics/recall_tasks.hpp through kdalab.mqar, kdalab.palindrome,
kdalab.stack_task), so every machine trains on the same tokens. The KDA-family mixers run kdalab's kernel through
kdalab.torch.chunk_kda (fla's calling convention) and so need a CUDA device. torch is imported only here.

Exit codes (docs/cli.md): 0 done (or stopped by --stop-after with its checkpoint saved), 2 bad input (one line,
nothing written), 3 cannot run here (no torch, no CUDA device or no kdalab.torch for a kernel mixer), 5 the results
file or the checkpoint could not be written, 128 + N stopped by signal N (SIGINT 130, SIGTERM 143: at a step
boundary, the checkpoint saved, no results file).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import shlex
import signal
import sys
import threading
import time
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

import kdalab

PROG = "python -m kdalab.train_recall"
DEFAULT_OUT = "results/train_recall.h5"
MAX_THREADS = 1024
TASKS = ("mqar", "palindrome", "stack")
MIXERS = ("softmax", "mla", "kda", "gated_deltanet", "deltanet")
KERNEL_MIXERS = ("kda", "gated_deltanet", "deltanet")  # through kdalab.torch.chunk_kda
KERNEL_MAX_HEAD_DIM = 256  # kdalab.torch.chunk_kda's largest key head size (smaller ones are zero-padded, exactly)
ZOOLOGY_LRS = [float(x) for x in np.logspace(-4, -2, 4)]  # Zoology Fig. 2: logspace(-4, -2, 4), best reported
KIMI_LRS = [5e-5, 1e-4, 5e-4, 1e-3]  # Kimi Linear report sec. 5.1
SDPA = "torch.nn.functional.scaled_dot_product_attention"

# The grids. Values the papers state: Zoology Fig. 2 (vocabulary 8192; (L, N) in (64, 4), (128, 8), (256, 16);
# 100k train / 3k test; 2 layers, no MLP; d_model 64-512; lr logspace(-4, -2, 4); 64 epochs; weight decay 0.1) and
# Kimi Linear sec. 5.1 (Palindrome, MQAR, Stack with 64 stacks; lengths 256-2048; 2 layers, 2 heads of 128;
# <= 20k steps; lr in {5e-5, 1e-4, 5e-4, 1e-3}). Batch sizes, the Kimi tasks' vocabularies and MQAR pair counts
# (L / 16, Zoology's ratio) are kdalab's choices (docs/recall-training.md).
GRIDS: Dict[str, Dict[str, Any]] = {
    "zoology": dict(tasks=["mqar"], seq_len=[64, 128, 256], kv_pairs=[4, 8, 16], d_model=[64, 128, 256, 512],
                    mixers=list(MIXERS), lr=ZOOLOGY_LRS, vocab=[8192], train_examples=100_000,
                    test_examples=3000, epochs=64, max_steps=0, heads=1, batch_size=64),
    # 3 x 3 x 3 x 2 = 54 runs of 2496 steps; 7.4 minutes of one H100 as 54 shards, 16 at a time under CUDA MPS, one CPU
    # thread each (measured; docs/recall-training.md)
    "zoology-reduced": dict(tasks=["mqar"], seq_len=[64, 128, 256], kv_pairs=[4, 8, 16], d_model=[64, 128, 256],
                            mixers=["softmax", "kda", "gated_deltanet"], lr=ZOOLOGY_LRS[1:3], vocab=[8192],
                            train_examples=20_000, test_examples=3000, epochs=8, max_steps=0, heads=1,
                            batch_size=64),
    "kimi": dict(tasks=["palindrome", "mqar", "stack"], seq_len=[256, 512, 1024, 2048], kv_pairs=[],
                 d_model=[256], mixers=["softmax", "kda", "gated_deltanet", "deltanet"], lr=KIMI_LRS,
                 vocab=[256, 8192, 256], train_examples=100_000, test_examples=1000, epochs=1000,
                 max_steps=20_000, heads=2, head_dim=128, batch_size=32),
    # 3 x 2 x 2 x 2 = 24 runs of 1500 steps; about 12 minutes of one H100 as 24 shards, 12-14 at a time (measured)
    "kimi-reduced": dict(tasks=["palindrome", "mqar", "stack"], seq_len=[256, 1024], kv_pairs=[], d_model=[256],
                         mixers=["kda", "gated_deltanet"], lr=KIMI_LRS[2:], vocab=[256, 8192, 256],
                         train_examples=24_000, test_examples=500, epochs=1000, max_steps=1500, heads=2,
                         head_dim=128, batch_size=32),
}
# A run's options without a grid: a tiny MQAR problem that trains on a laptop CPU in seconds.
TINY = dict(tasks=["mqar"], seq_len=[64], kv_pairs=[], d_model=[64], mixers=["softmax"], lr=[3e-3], vocab=[256],
            train_examples=3000, test_examples=500, epochs=3, max_steps=0, heads=1, head_dim=0, batch_size=32)
GRID_KEYS = tuple(TINY)


class BadInput(ValueError):
    """Bad options: one line, exit 2, nothing written."""


class CannotRun(RuntimeError):
    """The run cannot happen on this machine (exit 3)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one clear line, exit 2
        sys.stderr.write(f"{PROG}: error: {message}\n")
        sys.exit(2)


def _number(text: str) -> float:
    """A float option's value as typed, refused (bad input) when it underflows to 0 (`1e-400`): the check that
    follows would otherwise name 0.0, a value nobody typed."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    mantissa = re.split(r"[eE]", text.strip())[0]
    if v == 0.0 and re.search(r"[1-9]", mantissa):
        raise argparse.ArgumentTypeError(f"'{text}' underflows to 0 in double precision")
    return v


def _list(kind: Callable[[str], Any], name: str) -> Callable[[str], List[Any]]:
    def parse(text: str) -> List[Any]:
        try:
            return [kind(x) for x in text.split(",") if x != ""]
        except argparse.ArgumentTypeError as e:
            if "underflows" in str(e):
                raise
            raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of {name}") from None
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of {name}") from None
    return parse


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description=(
        "Train 2-layer models (embedding, [mixer + residual] per layer with pre-norm, no MLP, LM head) on "
        "Zoology's MQAR or the Kimi Linear report's Palindrome and Stack tasks, one run per (task, length, d_model, "
        "mixer, learning rate), and write the accuracy and loss curves, test accuracies and settings to one HDF5 "
        "file. Without --grid: a tiny MQAR run (seconds on a CPU). Options given with --grid replace the grid's. "
        "Documentation: docs/recall-training.md."), epilog=(
        "Exit codes: 0 done (or stopped by --stop-after), 2 bad input (one line, nothing written), 3 cannot run here "
        "(no torch, no CUDA device or no kdalab.torch for a kernel mixer), 5 the results file or the checkpoint "
        "could not be written or a run ran out of memory, 130 / 143 stopped by SIGINT / SIGTERM at a step boundary (the checkpoint saved, no "
        "results file; continue with --resume)."))
    g = p.add_argument
    g("--grid", choices=sorted(GRIDS), help="a preset grid: zoology (Fig. 2), zoology-reduced (54 runs), kimi (sec. 5.1), "
      "kimi-reduced (24 runs; about 12 min on one H100 as parallel shards)")
    g("--tasks", type=_list(str, "tasks"), help=f"tasks: {', '.join(TASKS)} (default: mqar)")
    g("--seq-len", type=_list(int, "integers"), help="sequence lengths L (default: 64)")
    g("--kv-pairs", type=_list(int, "integers"),
      help="MQAR key-value pairs N, one per --seq-len or one for all (default: L / 16)")
    g("--vocab", type=_list(int, "integers"), help="vocabulary size, one per task or one for all (default: 256)")
    g("--num-stacks", type=int, default=64, help="stacks of the Stack task (default: 64, the Kimi Linear report's)")
    g("--power-a", type=_number, default=0.01, help="MQAR query-gap exponent a: P(gap g) ~ (g+1)^(a-1) (default: 0.01)")
    g("--mixers", type=_list(str, "mixers"), help=f"sequence mixers: {', '.join(MIXERS)} (default: softmax)")
    g("--d-model", type=_list(int, "integers"), help="model widths (default: 64)")
    g("--heads", type=int, help="heads per mixer (default: 1); the KDA-family mixers split a head over 256 into "
      "ceil(head_dim / 256) equal heads")
    g("--head-dim", type=int, help="head dimension (default: d_model / heads)")
    g("--layers", type=int, default=2, help="layers (default: 2)")
    g("--mla-latent", type=int, default=0, help="Gated MLA latent width d_c of keys/values and of queries "
      "(default: heads x head_dim / 2)")
    g("--g-min", type=_number, default=-5.0, help="lower bound g_min of the KDA / Gated DeltaNet gate (default: -5)")
    g("--short-conv", choices=["on", "off"], default="on", help="causal depthwise convolution (kernel 4) on each "
      "mixer's q, k, v, as in Zoology and the KDA layer (default: on)")
    g("--pos-emb", choices=["none", "learned"], default="none", help="absolute position embeddings (default: none)")
    g("--tied-head", action="store_true", help="tie the LM head to the token embedding")
    g("--lr", type=_list(_number, "numbers"), help="learning rates, one run each (default: 3e-3)")
    g("--weight-decay", type=_number, default=0.1, help="AdamW weight decay (default: 0.1, Zoology's)")
    g("--batch-size", type=int, help="training batch size (default: 32)")
    g("--train-examples", type=int, help="training examples per (task, L, N, vocab) (default: 3000)")
    g("--test-examples", type=int, help="test examples (default: 500)")
    g("--epochs", type=int, help="passes over the training split (default: 3)")
    g("--max-steps", type=int, help="at most this many steps per run, 0: no limit (default: 0)")
    g("--eval-every", type=int, default=0, help="test accuracy every N steps besides the end, 0: only the end")
    g("--log-every", type=int, default=50, help="a progress line every N steps (default: 50)")
    g("--seed", type=int, default=1, help="seed of the data, the initialisation and the batch order (default: 1)")
    g("--device", default="auto", help="torch device: auto (cuda when present), cpu, cuda, cuda:N")
    g("--precision", choices=["auto", "fp32", "bf16"], default="auto",
      help="fp32, or bf16 autocast (default: bf16 on CUDA, fp32 on the CPU)")
    g("--threads", type=int, default=0, help=f"torch CPU threads, at most {MAX_THREADS}; 0: torch's default")
    g("--out", help=f"the results file (default: {DEFAULT_OUT}, its folder made when missing; the folder of a "
      "given --out must exist)")
    g("--force", action="store_true", help="replace an existing --out (and an existing checkpoint)")
    g("--checkpoint", help="the checkpoint file (default: OUT.ckpt); removed when the results file is written")
    g("--checkpoint-every", type=int, default=500, help="save the checkpoint every N steps (default: 500), 0: never")
    g("--resume", action="store_true", help="continue from the checkpoint of an interrupted run with the same options")
    g("--stop-after", type=int, default=0, help="stop after N steps of this invocation, saving the checkpoint "
      "(continue with --resume); for tests of resumption")
    g("--quiet", action="store_true", help="print only the summary")
    g("--shard", default=None, help="run shard I of N of the grid's runs (1 <= I <= N <= 100000, N at most the "
      "runs); join the shard files with kdalab merge (docs/cluster.md)")
    return p


# ---------------------------------------------------------------------------------------------- the options


@dataclasses.dataclass(frozen=True)
class Run:
    """One training run: a data cell (task, L, N, vocab) and a model (mixer, d_model) at one learning rate."""
    task: str
    seq_len: int
    kv_pairs: int
    vocab: int
    d_model: int
    mixer: str
    lr: float

    @property
    def cell(self) -> str:  # the data cell's text, the seed of its splits (kdalab.cell_seed)
        return f"train-recall {self.task} L={self.seq_len} N={self.kv_pairs} V={self.vocab}"

    @property
    def model_cell(self) -> str:  # one initialisation per model, shared by the learning rates
        return f"{self.cell} mixer={self.mixer} d={self.d_model}"

    def label(self) -> str:
        n = f" N={self.kv_pairs}" if self.task == "mqar" else ""
        return f"{self.task} L={self.seq_len}{n} d={self.d_model} {self.mixer} lr={self.lr:.3g}"


def resolve(a: argparse.Namespace) -> Dict[str, Any]:
    """The effective options (grid values replaced by given options), checked. Raises BadInput."""
    base = dict(GRIDS[a.grid]) if a.grid else dict(TINY)
    cfg: Dict[str, Any] = {}
    for key in GRID_KEYS:
        given = getattr(a, key, None)
        cfg[key] = given if given is not None else base.get(key, TINY[key])
    for key in ("num_stacks", "power_a", "layers", "mla_latent", "g_min", "short_conv", "pos_emb", "tied_head",
                "weight_decay", "eval_every", "log_every", "seed", "device", "precision", "threads"):
        cfg[key] = getattr(a, key)
    cfg["grid"] = a.grid or "none"
    if getattr(a, "shard", None) is not None:  # in config (kdalab merge ignores it) and in the checkpoint's options
        cfg["shard"] = a.shard

    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise BadInput(msg)

    for t in cfg["tasks"]:
        need(t in TASKS, f"--tasks: '{t}' is unknown; accepted: {', '.join(TASKS)}")
    for m in cfg["mixers"]:
        need(m in MIXERS, f"--mixers: '{m}' is unknown; accepted: {', '.join(MIXERS)}")
    for key, opt in (("tasks", "--tasks"), ("mixers", "--mixers"), ("seq_len", "--seq-len"), ("d_model", "--d-model"),
                     ("lr", "--lr"), ("vocab", "--vocab")):
        need(len(cfg[key]) > 0, f"{opt}: the list is empty; give at least one value")
        if key != "vocab":  # one value per task, so it may repeat; a repeat elsewhere would repeat runs
            twice = next((x for i, x in enumerate(cfg[key]) if x in cfg[key][:i]), None)
            need(twice is None, f"{opt}: {twice} is given twice; give each value once")
    for L in cfg["seq_len"]:
        need(2 <= L <= 1 << 20 and L % 2 == 0, f"--seq-len: {L} is not an even integer in [2, 1048576]")
    nl = len(cfg["seq_len"])
    kv = cfg["kv_pairs"]
    need(a.kv_pairs is None or "mqar" in cfg["tasks"], f"--kv-pairs: given, but --tasks {','.join(cfg['tasks'])} "
         "has no mqar (only MQAR has key-value pairs); leave it out or add mqar")
    need(len(kv) in (0, 1, nl), f"--kv-pairs: {len(kv)} values for {nl} lengths; give one, or one per --seq-len")
    cfg["kv_pairs"] = [kv[0]] * nl if len(kv) == 1 else (list(kv) if kv else [max(1, L // 16) for L in cfg["seq_len"]])
    for L, N in zip(cfg["seq_len"], cfg["kv_pairs"]):
        need(N >= 1 and 4 * N <= L or "mqar" not in cfg["tasks"],
             f"--kv-pairs: {N} pairs do not fit L = {L}; accepted: 1 <= N <= L / 4 (Zoology's bound)")
    nt = len(cfg["tasks"])
    need(len(cfg["vocab"]) in (1, nt), f"--vocab: {len(cfg['vocab'])} values for {nt} tasks; give one, or one per task")
    if len(cfg["vocab"]) == 1:
        cfg["vocab"] = cfg["vocab"] * nt
    for t, V in zip(cfg["tasks"], cfg["vocab"]):
        need(3 <= V <= 1 << 24, f"--vocab: {V} is not an integer in [3, 16777216]")
        if t == "palindrome":  # its tokens come from [2, V): one token would make the task trivial
            need(V >= 4, f"--vocab: {V} gives the Palindrome task {V - 2} token; accepted: >= 4 (two tokens)")
        if t == "stack":
            need(V > 2 + 2 * cfg["num_stacks"], f"--vocab: {V} leaves no value tokens for the Stack task with "
                 f"--num-stacks {cfg['num_stacks']}; accepted: > 2 + 2 x num_stacks = {2 + 2 * cfg['num_stacks']}")
        if t == "mqar":
            for N in cfg["kv_pairs"]:
                need(V // 2 - 1 >= N, f"--vocab: {V} holds {V // 2 - 1} MQAR keys, fewer than N = {N}")
    need(cfg["num_stacks"] >= 1, f"--num-stacks: {cfg['num_stacks']} must be >= 1")
    need(0 < cfg["power_a"] <= 1, f"--power-a: {cfg['power_a']} must be in (0, 1]")
    heads = cfg["heads"]
    need(heads >= 1, f"--heads: {heads} must be >= 1")
    need(a.head_dim is None or a.head_dim >= 1, f"--head-dim: {a.head_dim} must be >= 1")
    # the mixer's width heads x head_dim sizes its projections as d_model does its embedding: the same bound
    need(cfg["head_dim"] == 0 or heads * cfg["head_dim"] <= 65536,
         f"--heads x --head-dim: {heads} x {cfg['head_dim']} = {heads * cfg['head_dim']} is not in [1, 65536] (the "
         "mixer's width, bounded as --d-model)")
    for d in cfg["d_model"]:
        need(1 <= d <= 65536, f"--d-model: {d} is not an integer in [1, 65536]")
        need(cfg["head_dim"] > 0 or d % heads == 0, f"--d-model: {d} is not a multiple of --heads {heads}; give "
             "--head-dim")
    for d in cfg["d_model"]:
        for m in cfg["mixers"]:
            head_shape(cfg, m, d)  # a KDA-family head over 256 must split evenly
    need(1 <= cfg["layers"] <= 64, f"--layers: {cfg['layers']} is not in [1, 64]")
    need(0 <= cfg["mla_latent"] <= 65536, f"--mla-latent: {cfg['mla_latent']} is not in [1, 65536] (or 0: the "
         "default; bounded as --d-model)")
    need(math.isfinite(cfg["g_min"]) and cfg["g_min"] < 0, f"--g-min: {cfg['g_min']} must be a finite negative number")
    for lr in cfg["lr"]:
        need(math.isfinite(lr) and 0 < lr <= 1, f"--lr: {lr} must be in (0, 1]")
    need(math.isfinite(cfg["weight_decay"]) and cfg["weight_decay"] >= 0,
         f"--weight-decay: {cfg['weight_decay']} must be >= 0")
    for lr in cfg["lr"]:  # AdamW's decoupled decay multiplies the weights by 1 - lr wd each step
        need(lr * cfg["weight_decay"] < 1, f"--lr x --weight-decay: {lr:g} x {cfg['weight_decay']:g} = "
             f"{lr * cfg['weight_decay']:g}; accepted: < 1 (AdamW multiplies the weights by 1 - lr x weight decay each "
             "step: at >= 1 it zeroes or flips them)")
    need(cfg["batch_size"] >= 1, f"--batch-size: {cfg['batch_size']} must be >= 1")
    need(cfg["train_examples"] >= cfg["batch_size"],
         f"--train-examples: {cfg['train_examples']} is fewer than one batch (--batch-size {cfg['batch_size']})")
    need(cfg["test_examples"] >= 1, f"--test-examples: {cfg['test_examples']} must be >= 1")
    need(cfg["epochs"] >= 1, f"--epochs: {cfg['epochs']} must be >= 1")
    need(cfg["max_steps"] >= 0, f"--max-steps: {cfg['max_steps']} must be >= 0")
    for split in ("train_examples", "test_examples"):  # the generators' bound on one split (kdalab.MAX_TASK_TOKENS)
        for L in cfg["seq_len"]:
            need(cfg[split] * L <= kdalab.MAX_TASK_TOKENS,
                 f"--{split.replace('_', '-')}: {cfg[split]} examples of --seq-len {L} are {cfg[split] * L} tokens; "
                 f"accepted: examples x seq_len <= {kdalab.MAX_TASK_TOKENS}")
    need(0 <= cfg["seed"] < 1 << 64, f"--seed: {cfg['seed']} is not an integer in [0, 2^64 - 1]")
    for key in ("eval_every", "log_every"):
        need(cfg[key] >= 0, f"--{key.replace('_', '-')}: {cfg[key]} must be >= 0")
    # torch's OpenMP pool allocates per thread: --threads 1000000000 aborted the process (216 GB)
    need(0 <= cfg["threads"] <= MAX_THREADS, f"--threads: {cfg['threads']} is not an integer in [0, {MAX_THREADS}]")
    dev = cfg["device"]
    need(dev in ("auto", "cpu", "cuda") or (dev.startswith("cuda:") and dev[5:].isdigit()),
         f"--device: '{dev}' is not accepted; accepted: auto, cpu, cuda, cuda:N")
    shard_runs(cfg)  # --shard: its value, and N against the grid's runs
    return cfg


def head_shape(cfg: Dict[str, Any], mixer: str, d_model: int) -> Tuple[int, int]:
    """(heads, head_dim) of a mixer at width d_model, the one place that decides them: --heads and --head-dim
    (default d_model / heads). The KDA-family mixers run kdalab.torch.chunk_kda, which takes a key head of at most
    256 (a smaller one is zero-padded exactly; no padding shrinks a larger one), so there a head of more than 256 is
    split into f = ceil(head_dim / 256) equal heads: f x heads heads of head_dim / f, the same width heads x head_dim
    and so the same projection sizes as softmax and MLA, which keep the heads given (Zoology's d_model 512 with one
    head: 2 heads of 256 for kda, gated_deltanet, deltanet; docs/recall-training.md). Raises BadInput when head_dim
    does not split evenly."""
    H = cfg["heads"]
    hd = cfg["head_dim"] or d_model // H
    if mixer in KERNEL_MIXERS and hd > KERNEL_MAX_HEAD_DIM:
        f = -(-hd // KERNEL_MAX_HEAD_DIM)
        if hd % f:
            src = "--head-dim" if cfg["head_dim"] else f"--d-model {d_model} / --heads {H}"
            raise BadInput(f"{src}: head dim {hd} is over {KERNEL_MAX_HEAD_DIM} for --mixers {mixer} and does not "
                           f"split into {f} equal heads; accepted: a head dim <= {KERNEL_MAX_HEAD_DIM}, or one "
                           f"divisible by ceil(head dim / {KERNEL_MAX_HEAD_DIM})")
        H, hd = H * f, hd // f
    return H, hd


def runs_of(cfg: Dict[str, Any]) -> List[Run]:
    """Every run of the options, data cells outermost (one data set per cell)."""
    out = []
    for task, V in zip(cfg["tasks"], cfg["vocab"]):
        for L, N in zip(cfg["seq_len"], cfg["kv_pairs"]):
            for d in cfg["d_model"]:
                for m in cfg["mixers"]:
                    for lr in cfg["lr"]:
                        out.append(Run(task, L, N if task == "mqar" else 0, V, d, m, float(lr)))
    return out


# ---------------------------------------------------------------------------------------------- --shard
# The rules of the C++ sweeps' --shard (experiments/shard.hpp, docs/cluster.md): the same accepted values, messages,
# assignment and shard-file attributes, so kdalab merge joins train_recall shards like its own.

SHARD_ACCEPTED = ("; give I/N with integers 1 <= I <= N <= 100000 (e.g. --shard 2/4: the second of four shards; "
                  "docs/cluster.md)")
SHARD_COST_MODEL = ("a run costs steps x L x d_model^2 (every run of one options set has the same steps and layers; "
                    "the mixers' projections dominate at these lengths)")


def parse_shard(text: Optional[str]) -> Tuple[int, int]:
    """--shard's value "I/N" -> (I, N); None (not given) -> (0, 0), the whole grid. Raises BadInput."""
    if text is None:
        return 0, 0
    m = re.fullmatch(r"([1-9][0-9]{0,5})/([1-9][0-9]{0,5})", text)
    shown = text.encode("unicode_escape").decode("ascii")
    if not m:
        raise BadInput(f"--shard: '{shown}' is not accepted{SHARD_ACCEPTED}")
    i, n = int(m[1]), int(m[2])
    if not (i <= n <= 100000):
        raise BadInput(f"--shard: '{shown}' is not accepted{SHARD_ACCEPTED}")
    return i, n


def run_cost(run: Run, steps: int) -> float:
    """The expected cost of a run for the shard assignment (SHARD_COST_MODEL)."""
    return float(steps) * run.seq_len * run.d_model ** 2


def assign_shards(cost: Sequence[float], count: int) -> List[int]:
    """The shard (1-based) of each run, as kdalab::cli::assign_shards: longest first (ties: lower index), each to
    the least loaded shard (ties: fewer runs, then the lower shard)."""
    c = [x if math.isfinite(x) and x > 0 else 0.0 for x in cost]
    order = sorted(range(len(c)), key=lambda i: -c[i])  # stable: ties keep the lower index first
    load, npts, owner = [0.0] * count, [0] * count, [0] * len(c)
    for i in order:
        best = min(range(count), key=lambda s: (load[s], npts[s], s))
        load[best] += c[i]
        npts[best] += 1
        owner[i] = best + 1
    return owner


def shard_runs(cfg: Dict[str, Any]) -> List[int]:
    """The grid indices (into runs_of(cfg)) the run of cfg trains: all of them without cfg["shard"], else those
    assign_shards() gives its shard. Raises BadInput when the grid has fewer runs than shards."""
    runs = runs_of(cfg)
    index, count = parse_shard(cfg.get("shard"))
    if count == 0:
        return list(range(len(runs)))
    n = len(runs)
    if count > n:
        raise BadInput(f"--shard: '{index}/{count}' is not accepted: this grid has {n} point{'' if n == 1 else 's'}, "
                       f"so at most {n} shard{'' if n == 1 else 's'}; give N <= {n} (an empty shard would write a "
                       "file without rows)")
    steps = steps_per_run(cfg)
    owner = assign_shards([run_cost(r, steps) for r in runs], count)
    return [p for p in range(n) if owner[p] == index]


def steps_per_run(cfg: Dict[str, Any]) -> int:
    per_epoch = cfg["train_examples"] // cfg["batch_size"]
    total = per_epoch * cfg["epochs"]
    return min(total, cfg["max_steps"]) if cfg["max_steps"] else total


# ---------------------------------------------------------------------------------------------- data


def task_data(run: Run, split: str, n: int, seed: int, num_stacks: int, power_a: float) -> Dict[str, Any]:
    """One split of a run's data cell from kdalab's C++ generators: inputs, targets int64 [n, L]."""
    s = kdalab.cell_seed(seed, f"{run.cell} split={split}")
    if run.task == "mqar":
        return kdalab.mqar(n, run.seq_len, run.kv_pairs, run.vocab, s, power_a=power_a)
    if run.task == "palindrome":
        return kdalab.palindrome(n, run.seq_len, run.vocab, s)
    return kdalab.stack_task(n, run.seq_len, run.vocab, num_stacks, s)


def _unscored(run: Run, split: str, n: int) -> BadInput:
    """The bad input of a split without a scored position (no loss and no accuracy to measure)."""
    return BadInput(f"--tasks {run.task} at --seq-len {run.seq_len}: the {split} split ({n} examples) has no scored "
                    "position (a stack sequence this short pops nothing); accepted: a longer --seq-len")


def check_scored(runs: Sequence[Run], cfg: Dict[str, Any]) -> None:
    """Every split of every data cell of `runs` has a scored position, checked before any run trains (a split
    without one has no loss and no accuracy). The generators are prefix-stable (the first m examples of a split of n
    are the split of m), so the first 64 examples decide almost always; only a split whose first 64 score nothing is
    made whole. Raises BadInput naming the task, the length and the split."""
    seen = set()
    for run in runs:
        if run.cell in seen:
            continue
        seen.add(run.cell)
        for split, n in (("train", cfg["train_examples"]), ("test", cfg["test_examples"])):
            m = min(n, 64)
            d = task_data(run, split, m, cfg["seed"], cfg["num_stacks"], cfg["power_a"])
            if not (d["targets"] != kdalab.IGNORE_INDEX).any() and m < n:
                d = task_data(run, split, n, cfg["seed"], cfg["num_stacks"], cfg["power_a"])
            if not (d["targets"] != kdalab.IGNORE_INDEX).any():
                raise _unscored(run, split, n)


# ---------------------------------------------------------------------------------------------- the models
# Built lazily: torch is imported only when a run starts (the module imports without torch).


def _torch():
    try:
        import torch  # noqa: F401
    except ImportError as e:
        raise CannotRun(f"torch is not installed ({e}); install it (pip install torch) to train") from e
    return torch


def kernel_for(mixer: str, device) -> Tuple[Optional[Callable], str]:
    """The chunked KDA function a KDA-family mixer calls and its name; (None, SDPA) for the attention mixers.
    Raises CannotRun on a CPU device or without kdalab.torch.chunk_kda."""
    if mixer not in KERNEL_MIXERS:
        return None, SDPA
    if device.type != "cuda":
        raise CannotRun(f"--mixers {mixer}: it runs kdalab's CUDA KDA kernel (kdalab.torch.chunk_kda), which needs a "
                        f"CUDA device; this run's device is {device}. Run it on a GPU, or use softmax or mla here")
    try:
        from kdalab.torch import chunk_kda  # noqa: WPS433 (lazy: written for the CUDA build)
    except ImportError as e:
        raise CannotRun(f"--mixers {mixer}: kdalab.torch.chunk_kda is not available ({e}); it needs kdalab's "
                        "CUDA build (python/gpu_check.sh)") from e
    return chunk_kda, "kdalab.torch.chunk_kda"


def build_model(run: Run, cfg: Dict[str, Any], kda_fn: Optional[Callable] = None):
    """The model of a run (on the CPU; the caller moves it). kda_fn: the chunked KDA function of the KDA-family
    mixers, fla's convention: kda_fn(q, k, v, g, beta, scale=...) with q, k, g [B, T, H, K], v [B, T, H, V],
    beta [B, T, H], g the log-decay; returns o [B, T, H, V] or (o, final_state)."""
    torch = _torch()
    nn, F = torch.nn, torch.nn.functional
    d = run.d_model
    H, hd = head_shape(cfg, run.mixer, d)
    conv = cfg["short_conv"] == "on"

    class ShortConv(nn.Module):
        """Causal depthwise convolution, kernel 4, no bias (docs/equations.md, the KDA layer's ShortConv)."""
        def __init__(self, c: int):
            super().__init__()
            self.w = nn.Parameter(torch.zeros(c, 1, 4))
            with torch.no_grad():
                self.w[:, 0, 3] = 1.0  # starts as the identity
                self.w.add_(0.02 * torch.randn_like(self.w))

        grouped: Optional[bool] = None  # None: by device (grouped on CUDA); True / False force one form (tests)

        def forward(self, x):  # [B, T, C]
            if self.grouped if self.grouped is not None else x.is_cuda:
                # one grouped conv1d: a few kernels instead of the ~8 elementwise ones of the shifted form and their
                # backward (a step of these small models is bound by its kernel launches on a GPU). fp32 out of
                # autocast, as the shifted form computes (bf16 x times fp32 w promotes to fp32); cuDNN may round w to
                # TF32 there (~5e-4 relative, below the bf16 activations' 4e-3)
                with torch.autocast(device_type=x.device.type, enabled=False):
                    y = F.conv1d(F.pad(x.float().transpose(1, 2), (3, 0)), self.w, groups=x.shape[2])
                return y.transpose(1, 2)
            # four shifted copies (faster on a CPU than a grouped conv1d); the same sum as the grouped form
            T = x.shape[1]
            xp = F.pad(x, (0, 0, 3, 0))
            return sum(xp[:, j:j + T] * self.w[:, 0, j] for j in range(4))

    def maybe_conv(c: int):
        return ShortConv(c) if conv else nn.Identity()

    def heads(x):  # [B, T, H * e] -> [B, T, H, e]
        return x.view(x.shape[0], x.shape[1], H, -1)

    class Softmax(nn.Module):
        """Causal softmax attention (torch SDPA), H heads of hd."""
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = (nn.Linear(d, H * hd, bias=False) for _ in range(3))
            self.cq, self.ck, self.cv = (maybe_conv(H * hd) for _ in range(3))
            self.o = nn.Linear(H * hd, d, bias=False)

        def forward(self, x):
            q, k, v = (heads(c(p(x))).transpose(1, 2) for p, c in ((self.q, self.cq), (self.k, self.ck), (self.v, self.cv)))
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.o(o.transpose(1, 2).reshape(x.shape[0], x.shape[1], H * hd))

    class GatedMla(nn.Module):
        """Gated MLA without RoPE (docs/equations.md section 5; DeepSeek-V2 Eqs. 9-19, K3 report Eq. 7): latent
        c_kv = RMSNorm(W_DKV x) [d_c], k = W_UK c_kv, v = W_UV c_kv; c_q = RMSNorm(W_DQ x), q = W_UQ c_q;
        causal softmax attention; y = W_O [Sigmoid(W_G x) * o]. With --short-conv on, q, k, v pass through the same
        convolutions as the softmax mixer's (after the up-projections; a shared one on the input would have to hold
        the current and the previous token in the same channels), so the two differ only by the latent and the
        gate."""
        def __init__(self):
            super().__init__()
            dc = cfg["mla_latent"] or max(1, H * hd // 2)
            self.cq, self.ck, self.cv = (maybe_conv(H * hd) for _ in range(3))
            self.dkv, self.dq = nn.Linear(d, dc, bias=False), nn.Linear(d, dc, bias=False)
            self.nkv, self.nq = nn.RMSNorm(dc), nn.RMSNorm(dc)
            self.uk, self.uv, self.uq = (nn.Linear(dc, H * hd, bias=False) for _ in range(3))
            self.gate = nn.Linear(d, H * hd, bias=False)
            self.o = nn.Linear(H * hd, d, bias=False)

        def forward(self, x):
            c = self.nkv(self.dkv(x))
            q = heads(self.cq(self.uq(self.nq(self.dq(x))))).transpose(1, 2)
            k, v = heads(self.ck(self.uk(c))).transpose(1, 2), heads(self.cv(self.uv(c))).transpose(1, 2)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(x.shape[0], x.shape[1], -1)
            return self.o(torch.sigmoid(self.gate(x)) * o)

    class DeltaFamily(nn.Module):
        """The KDA layer (docs/equations.md section 3) and its Gated DeltaNet and DeltaNet restrictions:
        q, k = L2Norm(Swish(ShortConv(W x))), v = Swish(ShortConv(W_v x)), beta = Sigmoid(W_beta x);
        kda: g = g_min Sigmoid(exp(A_log) (W_up W_down x + bias)) per (head, key channel) (K3 report Eq. 5);
        gated_deltanet: the same bounded gate with one value per head, broadcast over the key channels;
        deltanet: g = 0; o = chunk_kda(q, k, v, g, beta); y = W_o [Sigmoid(W_g x) * RMSNorm(o)]."""
        def __init__(self, kind: str):
            super().__init__()
            self.kind = kind
            self.q, self.k, self.v = (nn.Linear(d, H * hd, bias=False) for _ in range(3))
            self.cq, self.ck, self.cv = (maybe_conv(H * hd) for _ in range(3))
            self.beta = nn.Linear(d, H, bias=False)
            if kind == "kda":
                self.down, self.up = nn.Linear(d, hd, bias=False), nn.Linear(hd, H * hd, bias=False)
                self.bias = nn.Parameter(torch.empty(H, hd).uniform_(-8.0, -2.0))  # slow decays at the start
            elif kind == "gated_deltanet":
                self.a = nn.Linear(d, H, bias=False)
                self.bias = nn.Parameter(torch.empty(H).uniform_(-8.0, -2.0))
            if kind != "deltanet":
                self.A_log = nn.Parameter(torch.zeros(H))
            self.norm = nn.RMSNorm(hd)
            self.gate = nn.Linear(d, H * hd, bias=False)
            self.o = nn.Linear(H * hd, d, bias=False)

        def forward(self, x):
            B, T = x.shape[0], x.shape[1]
            q, k, v = (heads(F.silu(c(p(x)))) for p, c in ((self.q, self.cq), (self.k, self.ck), (self.v, self.cv)))
            q, k = F.normalize(q.float(), dim=-1, eps=1e-6), F.normalize(k.float(), dim=-1, eps=1e-6)
            beta = torch.sigmoid(self.beta(x).float())
            g_min = cfg["g_min"]
            if self.kind == "kda":
                z = heads(self.up(self.down(x))).float()
                g = g_min * torch.sigmoid(self.A_log.exp()[:, None] * (z + self.bias))
            elif self.kind == "gated_deltanet":
                z = self.a(x).float()
                g = (g_min * torch.sigmoid(self.A_log.exp() * (z + self.bias)))[..., None].expand(B, T, H, hd)
            else:
                g = torch.zeros(B, T, H, hd, device=x.device)
            dt = v.dtype
            out = kda_fn(q.to(dt), k.to(dt), v, g.contiguous(), beta.to(dt), scale=hd ** -0.5)
            o = out[0] if isinstance(out, tuple) else out
            o = self.norm(o.to(x.dtype)).reshape(B, T, H * hd)
            return self.o(torch.sigmoid(self.gate(x)) * o)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(run.vocab, d)
            self.pos = nn.Embedding(run.seq_len, d) if cfg["pos_emb"] == "learned" else None
            self.norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(cfg["layers"]))
            mk = {"softmax": Softmax, "mla": GatedMla}.get(run.mixer) or (lambda: DeltaFamily(run.mixer))
            self.mixers = nn.ModuleList(mk() for _ in range(cfg["layers"]))
            self.norm = nn.LayerNorm(d)
            self.head = nn.Linear(d, run.vocab, bias=False)
            for mod in self.modules():
                if isinstance(mod, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(mod.weight, std=0.02)
            if cfg["tied_head"]:
                self.head.weight = self.emb.weight

        def forward(self, tokens, scored=None):
            """tokens [B, T] int64 -> logits [B, T, vocab]; with `scored` ([B, T] bool, or the int64 indices of
            those positions in the flattened [B * T], which need no device-to-host sync) the logits of the scored
            positions alone, [n, vocab] in row-major order: the LM head (d x vocab a position) and the loss need
            only those (MQAR scores N of L positions)."""
            x = self.emb(tokens)
            if self.pos is not None:
                x = x + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
            for norm, mixer in zip(self.norms, self.mixers):
                x = x + mixer(norm(x))
            if scored is not None:
                x = x[scored] if scored.dtype == torch.bool else x.flatten(0, 1).index_select(0, scored)
            return self.head(self.norm(x))

    if run.mixer in KERNEL_MIXERS and kda_fn is None:
        raise CannotRun(f"--mixers {run.mixer}: no chunked KDA function")
    return Model()


# ---------------------------------------------------------------------------------------------- training


@dataclasses.dataclass
class Result:
    run: Run
    kernel: str
    steps: int
    loss: List[float]
    train_accuracy: List[float]
    eval_step: List[int]
    eval_accuracy: List[float]
    test_accuracy: float
    seconds: float
    init_seed: int
    unscored_steps: List[int] = dataclasses.field(default_factory=list)  # steps whose batch scored nothing (NaN)

    def last_scored(self) -> Optional[int]:
        """The index of the last step whose batch had a scored position (its loss and accuracy are the run's
        final ones); None when no batch had one."""
        skip = set(self.unscored_steps)
        return next((i for i in range(len(self.loss) - 1, -1, -1) if i not in skip), None)


class Stopped(Exception):
    """--stop-after was reached; the checkpoint is saved."""


def _atomic_torch_save(obj: Any, path: str) -> None:
    torch = _torch()
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            try:
                torch.save(obj, f)
            except RuntimeError as e:  # torch's writer reports a short write (no space, I/O error) as RuntimeError
                raise OSError(f"cannot write the checkpoint {path} ({str(e).strip().splitlines()[0][:120]}); the "
                              "previous checkpoint, if any, is kept") from e
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


class Interrupted(Exception):
    """SIGINT or SIGTERM arrived; the checkpoint holds the last finished step (exit 128 + the signal's number)."""
    def __init__(self, signum: int, step: int):
        super().__init__(signum, step)
        self.signum, self.step = signum, step


class _Signals:
    """SIGINT and SIGTERM as a request to stop at the next step boundary (the checkpoint is then saved whole); a
    second signal stops at once (the previous checkpoint stays as it was: it is replaced atomically)."""
    def __init__(self):
        self.signum: Optional[int] = None
        self._old: Dict[int, Any] = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():  # only the main thread may set handlers
            for s in (signal.SIGINT, signal.SIGTERM):
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)

    def _handle(self, signum, frame):
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum


def _checked_state(state: Any, ckpt: str, runs: Sequence[Run]) -> Tuple[List[Result], int, Dict[str, Any]]:
    """The finished results, the run index and the current run's state of a loaded checkpoint; BadInput naming the
    file when it is not a checkpoint of these runs."""
    try:
        done = [Result(**{**r, "run": Run(**r["run"])}) for r in state["done"]]
        cur = state["current"]
        index, step = cur["index"], cur["step"]
        ok = (isinstance(index, int) and 0 <= index < len(runs) and Run(**cur["run"]) == runs[index]
              and len(done) == index and [r.run for r in done] == list(runs[:index])
              and isinstance(step, int) and step >= 0 and all(k in cur for k in ("model", "opt", "sched", "curves")))
    except (KeyError, TypeError, AttributeError, IndexError) as e:
        raise BadInput(f"--resume: {ckpt} is not a checkpoint of {PROG} ({type(e).__name__}: {e}); start again "
                       "with --force") from e
    if not ok:
        raise BadInput(f"--resume: {ckpt} does not hold a run of these options; start again with --force")
    return done, index, cur


def _resumable_config(cfg: Dict[str, Any]) -> Dict[str, Any]:  # what a resumed run must share with the first
    return {k: v for k, v in cfg.items() if k not in ("log_every", "threads")}


def _out_of_memory(e: BaseException) -> bool:
    """torch's out-of-memory errors: torch.OutOfMemoryError (CUDA) or the CPU allocator's RuntimeError."""
    oom = getattr(sys.modules.get("torch"), "OutOfMemoryError", None)
    text = str(e).lower()
    return (oom is not None and isinstance(e, oom)) or "out of memory" in text or "can't allocate memory" in text


class Trainer:
    def __init__(self, cfg: Dict[str, Any], device, printer: Callable[[str], None], ckpt_path: str,
                 stop_after: int = 0, ckpt_every: int = 0, kernels: Optional[Dict[str, Tuple[Callable, str]]] = None):
        self.torch = _torch()
        self.cfg, self.device, self.print = cfg, device, printer
        self.ckpt_path, self.stop_after, self.ckpt_every = ckpt_path, stop_after, ckpt_every
        self.kernels = kernels or {}
        self.steps_done_here = 0
        self.signals: Optional[_Signals] = None  # set by main(): a stop requested by SIGINT or SIGTERM
        self.done: List[Result] = []
        self._data_cell: Optional[str] = None
        self.bf16 = cfg["precision"] == "bf16" or (cfg["precision"] == "auto" and device.type == "cuda")

    # one data cell at a time, on the device, int32 (cast per batch)
    def data(self, run: Run):
        if self._data_cell != run.cell:
            torch, cfg = self.torch, self.cfg
            self._data = {}
            for split, n in (("train", cfg["train_examples"]), ("test", cfg["test_examples"])):
                d = task_data(run, split, n, cfg["seed"], cfg["num_stacks"], cfg["power_a"])
                if not (d["targets"] != kdalab.IGNORE_INDEX).any():  # main() checked it first (check_scored)
                    raise _unscored(run, split, n)
                self._data[split] = tuple(torch.from_numpy(d[k].astype(np.int32)).to(self.device)
                                          for k in ("inputs", "targets"))
                if split == "train":  # a host copy of the targets: each step finds its scored positions there
                    self._train_targets_host = torch.from_numpy(d["targets"].astype(np.int64))
            self._data_cell = run.cell
        return self._data

    def batch_indices(self, run: Run, step: int):
        """The examples of a step, on the host and on the device: a permutation per epoch seeded by the data cell and
        the epoch, so a step's batch is a function of the step alone (a resumed run sees the same batches)."""
        torch, cfg = self.torch, self.cfg
        per_epoch = cfg["train_examples"] // cfg["batch_size"]
        epoch, i = divmod(step, per_epoch)
        if getattr(self, "_perm_key", None) != (run.cell, epoch):
            gen = torch.Generator().manual_seed(kdalab.cell_seed(cfg["seed"], f"{run.cell} order epoch={epoch}") >> 1)
            self._perm_host = torch.randperm(cfg["train_examples"], generator=gen)
            self._perm = self._perm_host.to(self.device)
            self._perm_key = (run.cell, epoch)
        b = cfg["batch_size"]
        return self._perm_host[i * b:(i + 1) * b], self._perm[i * b:(i + 1) * b]

    def scored_batch(self, idx_host):
        """The scored positions of a training batch (int64 indices into the flattened [B, T]) and their targets,
        found on the host and copied without waiting for the device: a mask built on the device would need a
        device-to-host sync at every step to size them."""
        y = self._train_targets_host[idx_host].flatten()
        pos = (y != kdalab.IGNORE_INDEX).nonzero().squeeze(1)
        target = y[pos]
        if self.device.type == "cuda":
            return tuple(t.pin_memory().to(self.device, non_blocking=True) for t in (pos, target))
        return pos, target

    def logits(self, model, x, scored):
        """The logits of the scored positions ([n, vocab], fp32)."""
        torch = self.torch
        if self.bf16:
            with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16):
                return model(x, scored).float()
        return model(x, scored).float()

    def evaluate(self, model, run: Run) -> float:
        torch = self.torch
        x_all, y_all = self.data(run)["test"]
        correct = total = 0
        model.eval()
        with torch.no_grad():
            for i in range(0, x_all.shape[0], self.cfg["batch_size"]):
                x, y = x_all[i:i + self.cfg["batch_size"]].long(), y_all[i:i + self.cfg["batch_size"]].long()
                mask = y != kdalab.IGNORE_INDEX
                pred = self.logits(model, x, mask).argmax(-1)
                correct += int((pred == y[mask]).sum())
                total += int(mask.sum())
        model.train()
        return correct / max(total, 1)

    def save(self, index: int, run: Run, step: int, model, opt, sched, cur: Dict[str, Any]) -> None:
        state = {"config": _resumable_config(self.cfg), "done": [dataclasses.asdict(r) for r in self.done],
                 "current": {"index": index, "run": dataclasses.asdict(run), "step": step,
                             "model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                             "curves": cur}}
        _atomic_torch_save(state, self.ckpt_path)

    def train(self, index: int, count: int, run: Run, resume: Optional[Dict[str, Any]] = None) -> Result:
        torch, cfg = self.torch, self.cfg
        F = torch.nn.functional
        kda_fn, kernel = self.kernels.get(run.mixer) or kernel_for(run.mixer, self.device)
        init_seed = kdalab.cell_seed(cfg["seed"], f"{run.model_cell} init")
        torch.manual_seed(init_seed >> 1)
        model = build_model(run, cfg, kda_fn).to(self.device)
        decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
        no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
        # CUDA: the fused AdamW (one kernel for every parameter instead of a few per tensor)
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg["weight_decay"]},
                                 {"params": no_decay, "weight_decay": 0.0}], lr=run.lr,
                                **({"fused": True} if self.device.type == "cuda" else {}))
        total = steps_per_run(cfg)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, total) / total)))
        cur: Dict[str, Any] = {"loss": [], "acc": [], "eval_step": [], "eval_acc": [], "seconds": 0.0, "unscored": []}
        step = 0
        if resume is not None:
            try:  # a checkpoint that unpickles can still hold a damaged or inconsistent run state
                model.load_state_dict(resume["model"])
                opt.load_state_dict(resume["opt"])
                sched.load_state_dict(resume["sched"])
                cur, step = resume["curves"], resume["step"]
                cur.setdefault("unscored", [])
                lists = all(isinstance(cur.get(k), list) for k in ("loss", "acc", "eval_step", "eval_acc"))
                ok = (lists and isinstance(cur.get("seconds"), (int, float)) and isinstance(step, int)
                      and 0 <= step < total and len(cur["loss"]) == len(cur["acc"]) == step
                      and isinstance(cur["unscored"], list))
            except (RuntimeError, KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
                raise BadInput(f"--resume: {self.ckpt_path} holds a damaged run state ({type(e).__name__}); start "
                               "again with --force") from e
            if not ok:
                raise BadInput(f"--resume: {self.ckpt_path} holds an inconsistent run state (its step and curves do "
                               f"not agree with a run of {total} steps); start again with --force")
        self.data(run)
        t0 = time.perf_counter() - cur["seconds"]
        x_all = self.data(run)["train"][0]
        # each step's loss and batch accuracy stay on the device until they are read (a progress line, a checkpoint,
        # the end): no host synchronisation per step, so the host queues the next steps while the device works
        pending: List[Any] = []

        def flush():
            if pending:
                vals = torch.stack(pending).float().cpu().tolist()
                cur["loss"].extend(v[0] for v in vals)
                cur["acc"].extend(v[1] for v in vals)
                pending.clear()

        while step < total:
            if self.signals is not None and self.signals.signum is not None:
                flush()
                cur["seconds"] = time.perf_counter() - t0
                self.save(index, run, step, model, opt, sched, cur)
                raise Interrupted(self.signals.signum, step)
            if self.stop_after and self.steps_done_here >= self.stop_after:
                flush()
                cur["seconds"] = time.perf_counter() - t0
                self.save(index, run, step, model, opt, sched, cur)
                raise Stopped()
            idx_host, idx = self.batch_indices(run, step)
            x = x_all[idx].long()
            pos, target = self.scored_batch(idx_host)
            if len(pos) == 0:  # a batch that scores nothing (short Stack sequences): no loss, NaN in the curves
                cur["unscored"].append(step)
            logits = self.logits(model, x, pos)  # [n scored, vocab]
            loss = F.cross_entropy(logits, target)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            with torch.no_grad():
                pending.append(torch.stack([loss.detach().float(), (logits.argmax(-1) == target).float().mean()]))
            step += 1
            self.steps_done_here += 1
            if cfg["eval_every"] and step % cfg["eval_every"] == 0 and step < total:
                cur["eval_step"].append(step)
                cur["eval_acc"].append(self.evaluate(model, run))
            if cfg["log_every"] and (step % cfg["log_every"] == 0 or step == total):
                flush()
                self.print(f"[{index + 1}/{count}] {run.label()}: step {step}/{total} loss {cur['loss'][-1]:.4f} "
                           f"train acc {cur['acc'][-1]:.3f} ({time.perf_counter() - t0:.1f} s)")
            if self.ckpt_every and step % self.ckpt_every == 0 and step < total:
                flush()
                cur["seconds"] = time.perf_counter() - t0
                self.save(index, run, step, model, opt, sched, cur)
            if len(pending) >= 1000:  # bounded: one small transfer per 1000 steps at most
                flush()
        flush()
        test_acc = self.evaluate(model, run)
        cur["eval_step"].append(total)
        cur["eval_acc"].append(test_acc)
        seconds = time.perf_counter() - t0
        self.print(f"[{index + 1}/{count}] {run.label()}: test accuracy {test_acc:.4f} ({seconds:.1f} s, {kernel})")
        return Result(run, kernel, total, cur["loss"], cur["acc"], cur["eval_step"], cur["eval_acc"], test_acc,
                      seconds, init_seed, cur["unscored"])


# ---------------------------------------------------------------------------------------------- results


def best_flags(results: Sequence[Result]) -> List[int]:
    """1 for the run of best test accuracy among the learning rates of its (task, L, N, vocab, d, mixer)."""
    best: Dict[Tuple, int] = {}
    for i, r in enumerate(results):
        key = dataclasses.astuple(r.run)[:-1]
        if key not in best or r.test_accuracy > results[best[key]].test_accuracy:
            best[key] = i
    chosen = set(best.values())
    return [int(i in chosen) for i in range(len(results))]


def write_results(path: str, cfg: Dict[str, Any], results: Sequence[Result], device_name: str, bf16: bool,
                  force: bool, command_line: str, points: Optional[Sequence[int]] = None) -> None:
    """points: the grid index of each result (default 0, 1, ...), the name of its runs/NNN group. With cfg["shard"]
    (--shard I/N) the file is a shard file that kdalab merge joins (experiments/shard.hpp)."""
    shard = parse_shard(cfg.get("shard"))
    torch = _torch()
    flags = best_flags(results)
    n = len(results)
    points = list(range(n)) if points is None else list(points)
    reduced = cfg["grid"].endswith("-reduced")
    config = {k.replace("_", "-"): v for k, v in cfg.items()}
    config["out"] = path
    with kdalab.ResultsFile(path, force=force, command_line=command_line, config=json.dumps(config, sort_keys=True),
                            seed=str(cfg["seed"])) as f:
        g = "train_recall"
        if shard[1]:
            record_shard(f, shard, points, len(runs_of(cfg)))
        f.group(g, "Trained associative recall (docs/recall-training.md): one row per run (task, length, width, "
                   "mixer, learning rate); curves per run under runs/NNN")
        f.attr(g, "grid", cfg["grid"])
        f.attr(g, "runs", float(n))
        f.attr(g, "note", f"reduced grid: {n} runs" if reduced else f"{n} runs")
        f.attr(g, "torch_version", torch.__version__)
        f.attr(g, "torch_device", device_name)
        f.attr(g, "precision", "bf16 autocast" if bf16 else "fp32")
        col = lambda name, units, desc, vals: (name, units, desc, list(vals))
        R = [r.run for r in results]
        f.write_table(g, [
            col("task", "1", "mqar, palindrome, stack", [r.task for r in R]),
            col("seq_len", "tokens", "sequence length L", [r.seq_len for r in R]),
            col("kv_pairs", "1", "MQAR key-value pairs N (0: other tasks)", [r.kv_pairs for r in R]),
            col("vocab", "tokens", "vocabulary size", [r.vocab for r in R]),
            col("d_model", "1", "model width", [r.d_model for r in R]),
            col("mixer", "1", "sequence mixer: softmax, mla, kda, gated_deltanet, deltanet", [r.mixer for r in R]),
            col("heads", "1", "heads of the mixer (a KDA-family head over 256 is split: docs/recall-training.md)",
                [head_shape(cfg, r.mixer, r.d_model)[0] for r in R]),
            col("head_dim", "1", "head size of the mixer (d_k = d_v)",
                [head_shape(cfg, r.mixer, r.d_model)[1] for r in R]),
            col("kernel", "1", "what computed the mixer", [x.kernel for x in results]),
            col("lr", "1", "peak learning rate (AdamW, cosine decay)", [r.lr for r in R]),
            col("steps", "1", "optimizer steps", [x.steps for x in results]),
            col("test_accuracy", "1", "fraction of scored test positions predicted exactly",
                [x.test_accuracy for x in results]),
            col("final_train_accuracy", "1", "accuracy on the last training batch with a scored position",
                [_final(x, x.train_accuracy) for x in results]),
            col("final_loss", "nat", "cross entropy of the last training batch with a scored position",
                [_final(x, x.loss) for x in results]),
            col("best_lr", "1", "1: the best test accuracy among the learning rates of its model", flags),
            col("seconds", "s", "wall time of the run", [x.seconds for x in results]),
            col("init_seed", "1", "torch seed of the initialisation (cell_seed >> 1)",
                [str(x.init_seed >> 1) for x in results]),
            col("train_data_seed", "1", "seed of the training split's generator (cell_seed of the data cell)",
                [str(kdalab.cell_seed(cfg["seed"], f"{r.cell} split=train")) for r in R]),
            col("test_data_seed", "1", "seed of the test split's generator",
                [str(kdalab.cell_seed(cfg["seed"], f"{r.cell} split=test")) for r in R]),
        ])
        f.group(f"{g}/runs", "the curves of each run: one group per run, named by its row in the whole grid")
        if shard[1]:
            f.attr(g, "shard_row_keys", ",".join(str(p) for p in points))
            f.attr(f"{g}/runs", "shard_row_groups", "one child group per grid point, joined from every shard")
        for i, x in zip(points, results):
            rg = f"{g}/runs/{i:03d}"
            f.group(rg, x.run.label())
            f.attr(rg, "kernel", x.kernel)
            f.attr(rg, "test_accuracy", x.test_accuracy)
            f.write_array(rg, "loss", np.asarray(x.loss, dtype=np.float64), units="nat",
                          description="training cross entropy per step (scored positions)")
            f.write_array(rg, "train_accuracy", np.asarray(x.train_accuracy, dtype=np.float64), units="1",
                          description="accuracy of each step's training batch (scored positions)")
            f.write_array(rg, "eval_step", np.asarray(x.eval_step, dtype=np.float64), units="1",
                          description="steps of the test evaluations (the last one: the end)")
            f.write_array(rg, "eval_accuracy", np.asarray(x.eval_accuracy, dtype=np.float64), units="1",
                          description="test accuracy at eval_step")


def record_shard(f, shard: Tuple[int, int], points: Sequence[int], grid: int) -> None:
    """The root attributes of a shard file, as the C++ sweeps write them (kdalab::cli::ShardPlan::record)."""
    index, count = shard
    for name, value in (("shard", f"{index}/{count}"), ("shard_index", str(index)), ("shard_count", str(count)),
                        ("shard_subcommand", "train_recall"), ("shard_points", ",".join(str(p) for p in points)),
                        ("grid_points", str(grid)), ("shard_cost_model", SHARD_COST_MODEL)):
        f.attr("/", name, value)


def _final(r: Result, curve: Sequence[float]) -> float:
    """The value of `curve` at the run's last step with a scored position (NaN when none had one)."""
    i = r.last_scored()
    return float("nan") if i is None else curve[i]


def summary(results: Sequence[Result]) -> str:
    flags = best_flags(results)
    lines = ["best learning rate per model (test accuracy on the test split):"]
    per_model: Dict[Tuple, int] = {}
    for r in results:
        key = dataclasses.astuple(r.run)[:-1]
        per_model[key] = per_model.get(key, 0) + 1
    for r, b in zip(results, flags):
        if b:
            n = per_model[dataclasses.astuple(r.run)[:-1]]
            last = r.last_scored()
            diverged = ("; diverged: the last loss is not finite" if last is not None and not math.isfinite(r.loss[last])
                        else "")
            lines.append(f"  {r.run.label().rsplit(' lr=', 1)[0]:<48} {r.test_accuracy:.4f}  (lr {r.run.lr:.3g}, best of "
                         f"{n}; {r.steps} steps, {r.seconds:.1f} s{diverged})")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- main


def main(argv: Optional[List[str]] = None, kernels: Optional[Dict[str, Tuple[Callable, str]]] = None) -> int:
    """The command line. kernels: mixer -> (chunked KDA function, its name), replacing kdalab.torch.chunk_kda and
    its device check (tests run the KDA-family mixers on the CPU through a reference recurrence this way)."""
    try:
        return _main(argv, kernels)
    except KeyboardInterrupt:  # SIGINT before the training loop's own handler (torch's import, checks, data)
        sys.stderr.write(f"{PROG}: interrupted before training; no results file was written\n")
        return 130


def _main(argv: Optional[List[str]], kernels: Optional[Dict[str, Tuple[Callable, str]]]) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    a = parser().parse_args(argv)
    printer = (lambda s: None) if a.quiet else (lambda s: print(s, flush=True))
    try:
        cfg = resolve(a)
        points = shard_runs(cfg)
        for opt in ("checkpoint_every", "stop_after"):
            if getattr(a, opt) < 0:
                raise BadInput(f"--{opt.replace('_', '-')}: {getattr(a, opt)} must be >= 0")
        if a.out == "":
            raise BadInput("--out '': give a file name, e.g. --out results/train_recall.h5")
        if a.checkpoint == "":
            raise BadInput("--checkpoint '': give a file name, or leave the option out (OUT.ckpt)")
        out = a.out if a.out is not None else DEFAULT_OUT
        ckpt = a.checkpoint or out + ".ckpt"
        for opt, path in (("--out", out), ("--checkpoint", ckpt)):  # a folder or a special file is never replaced
            if os.path.isdir(path):
                raise BadInput(f"{opt} {path} is a folder; give a file name")
            if os.path.exists(path) and not os.path.isfile(path):
                raise BadInput(f"{opt} {path} is not a regular file (a FIFO, device or socket); give a file name")
        if os.path.exists(out) and not a.force:
            raise BadInput(f"--out {out} exists; it is replaced only with --force")
        if os.path.realpath(ckpt) == os.path.realpath(out):  # the results file would find its checkpoint in its place
            raise BadInput(f"--checkpoint {ckpt} is the --out file; give another name (default: OUT.ckpt)")
        # a given --out or --checkpoint names an existing folder (a typo must not create folders); the default
        # results/ is made when missing, after every check
        for opt, path, given in (("--out", out, a.out is not None), ("--checkpoint", ckpt, a.checkpoint is not None
                                                                     or a.out is not None)):
            folder = os.path.dirname(path) or "."
            if given and not os.path.isdir(folder):
                raise BadInput(f"{opt} {path}: its folder {folder} does not exist; create it first")
        def check_out() -> None:  # the results writer's own checks (a name too long, a special file, ...), so that
            # they are found before training, not when the results are written
            try:
                kdalab.check_output_path(out, force=a.force)
            except kdalab.Error as e:
                raise BadInput(str(e)) from e
            except RuntimeError as e:  # the folder is not writable
                raise OSError(str(e)) from e

        out_checked = os.path.isdir(os.path.dirname(out) or ".")
        if out_checked:  # else the default folder results/ is made below, and checked then
            check_out()
        if a.resume and not os.path.isfile(ckpt):
            raise BadInput(f"--resume: no checkpoint {ckpt} to continue from")
        if not a.resume and os.path.exists(ckpt) and not a.force:
            raise BadInput(f"the checkpoint {ckpt} of an interrupted run exists: continue it with --resume, or start "
                           "again with --force")
        torch = _torch()
        dev = cfg["device"]
        if dev == "auto":
            dev = "cuda" if torch.cuda.is_available() else "cpu"
        if dev.startswith("cuda") and not torch.cuda.is_available():
            raise CannotRun(f"--device {dev}: torch sees no CUDA device (torch {torch.__version__})")
        device = torch.device(dev)
        if cfg["threads"]:
            torch.set_num_threads(cfg["threads"])
        grid_runs = runs_of(cfg)
        runs = [grid_runs[p] for p in points]
        kernels = dict(kernels or {})
        for m in dict.fromkeys(r.mixer for r in runs):  # every mixer checked before anything runs
            if m not in kernels:
                kernels[m] = kernel_for(m, device)
        check_scored(runs, cfg)  # every data cell, before the first run trains
        device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        state = None
        if a.resume:
            try:  # weights_only: plain data and tensors, so a foreign pickle runs no code
                with warnings.catch_warnings():  # torch warns in two lines about a foreign pickle before failing
                    warnings.simplefilter("ignore")
                    state = torch.load(ckpt, map_location=device, weights_only=True)
            except Exception as e:  # torch raises UnpicklingError, RuntimeError, EOFError, ... on a bad file (its
                # text is many lines, about torch's weights_only default): the type names the cause
                raise BadInput(f"--resume: {ckpt} is not a readable checkpoint of {PROG} (torch.load: "
                               f"{type(e).__name__}); start again with --force") from e
            if not isinstance(state, dict) or not isinstance(state.get("config"), dict):
                raise BadInput(f"--resume: {ckpt} is not a checkpoint of {PROG} (no options recorded); start again "
                               "with --force")
            if state["config"] != _resumable_config(cfg):
                diff = sorted(k for k in set(state["config"]) | set(cfg)
                              if k in _resumable_config(cfg) and state["config"].get(k) != cfg.get(k))
                raise BadInput(f"--resume: the checkpoint {ckpt} was made with other options ({', '.join(diff)}); "
                               "give the same options")
            resumed = _checked_state(state, ckpt, runs)
        for path in (out, ckpt):
            folder = os.path.dirname(path) or "."
            os.makedirs(folder, exist_ok=True)  # only the default's results/ can be missing here
            if not os.access(folder, os.W_OK):  # found now, not after hours of training
                raise OSError(f"cannot write '{path}': folder '{folder}' is not writable; nothing was written")
        if not out_checked:
            check_out()
    except BadInput as e:
        sys.stderr.write(f"{PROG}: error: {e}\n")
        return 2
    except CannotRun as e:
        sys.stderr.write(f"{PROG}: cannot run here: {e}\n")
        return 3
    except OSError as e:
        sys.stderr.write(f"{PROG}: error: {e}\n")
        return 5

    total = steps_per_run(cfg)
    part = f", shard {a.shard}: runs {', '.join(str(p) for p in points)} of {len(grid_runs)}" if a.shard else ""
    printer(f"{len(runs)} runs of {total} steps on {device_name} (grid {cfg['grid']}{part}); results: {out}")
    trainer = Trainer(cfg, device, printer, ckpt, stop_after=a.stop_after, ckpt_every=a.checkpoint_every,
                      kernels=kernels)
    start, current = 0, None
    if state is not None:
        trainer.done, start, current = resumed
        printer(f"resuming run {start + 1} of {len(runs)} at step {current['step']}")
    with _Signals() as signals:
        trainer.signals = signals
        try:
            for i in range(start, len(runs)):
                trainer.done.append(trainer.train(i, len(runs), runs[i], current if i == start else None))
            try:
                write_results(out, cfg, trainer.done, device_name, trainer.bf16, a.force,
                              " ".join([PROG] + [shlex.quote(s) for s in argv]), points)
            except RuntimeError as e:  # the results writer's environment failures (no space, I/O, permission)
                raise OSError(str(e)) from e
        except Stopped:
            printer(f"stopped after {a.stop_after} steps (--stop-after); the checkpoint {ckpt} holds the run: "
                    "continue with --resume")
            return 0
        except BadInput as e:  # found when a run's data is made (a split with no scored position): no results file
            sys.stderr.write(f"{PROG}: error: {e}\n")
            return 2
        except Interrupted as e:
            sys.stderr.write(f"{PROG}: interrupted by {signal.Signals(e.signum).name} at step {e.step} of run "
                             f"{len(trainer.done) + 1} of {len(runs)}; no results file was written; the checkpoint "
                             f"{ckpt} holds the run: continue with --resume\n")
            return 128 + e.signum
        except KeyboardInterrupt:  # a second signal: stopped at once
            sys.stderr.write(f"{PROG}: interrupted; no results file was written (the checkpoint {ckpt}, if any, "
                             "holds an earlier step)\n")
            return 130
        except OSError as e:  # the checkpoint's or the results file's environment failures (no space, I/O, permission)
            sys.stderr.write(f"{PROG}: error: {(str(e).strip().splitlines() or [''])[0]}\n")
            return 5
        except RuntimeError as e:  # out of memory (the device's or the host's): the environment, one line, exit 5
            if not _out_of_memory(e):
                raise
            i = len(trainer.done)
            r = runs[i] if i < len(runs) else None
            what = f"run {i + 1} of {len(runs)} ({r.label()}) " if r is not None else ""
            sys.stderr.write(f"{PROG}: error: out of memory in {what}on {device_name}: "
                             f"{(str(e).strip().splitlines() or [''])[0][:160]}; no results file was written; accepted: "
                             "a smaller --d-model, --vocab, --batch-size or --seq-len\n")
            return 5
    if os.path.exists(ckpt):
        os.remove(ckpt)
    print(summary(trainer.done))
    return 0


if __name__ == "__main__":
    sys.exit(main())
