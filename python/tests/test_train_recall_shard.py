"""python -m kdalab.train_recall --shard I/N and kdalab merge of its shard files (docs/cluster.md,
docs/recall-training.md). No training: the shard files are written by train_recall's own writer from synthetic runs,
so these run without torch. The merge needs the kdalab binary: KDALAB_BIN, or build/default/experiments/kdalab."""
import os
import pathlib
import subprocess
import sys
import types

import numpy as np
import pytest

import kdalab
from kdalab import train_recall as tr

ROOT = pathlib.Path(__file__).resolve().parents[2]
# 2 widths x 2 mixers x 3 learning rates: 12 runs of unequal cost (d_model 32 and 64)
GRID = ["--vocab", "64", "--seq-len", "32", "--kv-pairs", "4", "--d-model", "32,64", "--mixers", "softmax,mla",
        "--lr", "1e-3,3e-3,1e-2", "--device", "cpu"]


def config(*extra):
    return tr.resolve(tr.parser().parse_args(GRID + list(extra)))


def run_cli(argv):
    try:
        return tr.main(argv)
    except SystemExit as e:  # argparse's own errors
        return e.code


# ---- the assignment


@pytest.mark.parametrize("count", [1, 2, 5, 12])
def test_shards_cover_the_grid_once_deterministically_and_balanced(count):
    shards = [tr.shard_runs(config("--shard", f"{i}/{count}")) for i in range(1, count + 1)]
    assert sorted(p for s in shards for p in s) == list(range(12))
    assert all(s for s in shards) and all(s == sorted(s) for s in shards)
    assert shards == [tr.shard_runs(config("--shard", f"{i}/{count}")) for i in range(1, count + 1)]
    # longest first to the least loaded shard: the loads differ by at most the largest run's cost
    runs, steps = tr.runs_of(config()), tr.steps_per_run(config())
    load = [sum(tr.run_cost(runs[p], steps) for p in s) for s in shards]
    assert max(load) - min(load) <= max(tr.run_cost(r, steps) for r in runs)


def test_the_assignment_follows_the_cpp_rules():
    # longest first (ties: lower index), each to the least loaded shard (ties: fewer points, then the lower shard)
    assert tr.assign_shards([1, 5, 3, 3, 0, 0], 2) == [1, 1, 2, 2, 1, 2]  # loads 5-0, 5-3, 5-6, 6-6; equal loads: fewer runs
    assert tr.assign_shards([0, 0, 0], 3) == [1, 2, 3]


def test_a_run_keeps_its_seeds_in_every_shard():
    whole = tr.runs_of(config())
    for i in (1, 2, 3):
        cfg = config("--shard", f"{i}/3")
        for p in tr.shard_runs(cfg):
            assert tr.runs_of(cfg)[p] == whole[p]  # the run, so its cell_seed-derived data and init seeds
    assert config("--shard", "2/3")["seed"] == config()["seed"]


@pytest.mark.parametrize("value, says", [
    ("0/4", "'0/4' is not accepted; give I/N with integers 1 <= I <= N <= 100000"),
    ("5/4", "'5/4' is not accepted; give I/N"),
    ("01/4", "'01/4' is not accepted"),
    ("a/b", "'a/b' is not accepted"),
    ("4", "'4' is not accepted"),
    ("", "'' is not accepted"),
    ("1/100001", "'1/100001' is not accepted"),
    ("1/13", "'1/13' is not accepted: this grid has 12 points, so at most 12 shards; give N <= 12"),
])
def test_bad_shard_values_are_one_line_exit_2_and_write_nothing(tmp_path, capsys, value, says):
    assert run_cli(GRID + ["--shard", value, "--out", str(tmp_path / "r.h5")]) == 2
    err = capsys.readouterr().err
    assert err == f"python -m kdalab.train_recall: error: --shard: {err.split('--shard: ', 1)[1]}"
    assert says in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


# ---- shard files and their merge


def synthetic_run(cfg, p, run):
    """A finished run without training: curves and a test accuracy that depend on the grid index only."""
    steps = 3
    acc = 0.1 + 0.07 * ((p * 5) % 12)  # the best learning rate of a model is not the first of the grid
    return tr.Result(run, tr.SDPA, steps, [2.0 - 0.1 * p - s for s in range(steps)], [0.1 * s for s in range(steps)],
                     [steps], [acc], acc, 1.0 + p, kdalab.cell_seed(cfg["seed"], f"{run.model_cell} init"))


def write(path, *extra):
    """The file train_recall writes for the grid with these options (--shard among them), from synthetic runs."""
    cfg = config(*extra)
    points = tr.shard_runs(cfg)
    runs = tr.runs_of(cfg)
    results = [synthetic_run(cfg, p, runs[p]) for p in points]
    tr.write_results(str(path), cfg, results, "cpu", False, False, "test", points)
    return path


@pytest.fixture
def no_torch(monkeypatch):  # the writer reads only torch.__version__
    monkeypatch.setattr(tr, "_torch", lambda: types.SimpleNamespace(__version__="none"))


def merge(*args):
    binary = os.environ.get("KDALAB_BIN") or str(ROOT / "build" / "default" / "experiments" / "kdalab")
    if not os.path.exists(binary):
        pytest.skip(f"no kdalab binary at {binary} (set KDALAB_BIN)")
    return subprocess.run([binary, "merge", *map(str, args)], capture_output=True, text=True)


def test_a_shard_file_records_its_shard_like_the_cpp_sweeps(tmp_path, no_torch):
    f = str(write(tmp_path / "s2.h5", "--shard", "2/3"))
    attr = lambda name: kdalab.read_attr(f, "/", name)
    points = tr.shard_runs(config("--shard", "2/3"))
    assert (attr("shard"), attr("shard_index"), attr("shard_count")) == ("2/3", "2", "3")
    assert attr("shard_subcommand") == "train_recall" and attr("grid_points") == "12"
    assert attr("shard_points") == ",".join(map(str, points)) and "L x d_model^2" in attr("shard_cost_model")
    assert kdalab.members(f, "train_recall/runs") == [f"{p:03d}" for p in points]


def test_merged_shards_equal_the_unsharded_file(tmp_path, no_torch):
    whole = str(write(tmp_path / "whole.h5"))
    shards = [write(tmp_path / f"s{i}.h5", "--shard", f"{i}/3") for i in (3, 1, 2)]  # any order
    out = str(tmp_path / "merged.h5")
    r = merge(*shards, "--out", out)
    assert r.returncode == 0, r.stderr
    assert kdalab.read_attr(out, "/", "merged_subcommand") == "train_recall"
    for a in ("grid", "runs", "note"):
        assert kdalab.read_attr(out, "train_recall", a) == kdalab.read_attr(whole, "train_recall", a)
    for col in ("seq_len", "kv_pairs", "vocab", "d_model", "lr", "steps", "test_accuracy", "final_loss", "best_lr",
                "seconds"):
        assert np.array_equal(kdalab.read_array(out, f"train_recall/{col}"),
                              kdalab.read_array(whole, f"train_recall/{col}")), col
    assert sum(kdalab.read_array(out, "train_recall/best_lr")) == 4  # one per (d_model, mixer)
    assert kdalab.members(out, "train_recall/runs") == [f"{p:03d}" for p in range(12)]
    for p in range(12):
        for name in ("loss", "train_accuracy", "eval_step", "eval_accuracy"):
            assert np.array_equal(kdalab.read_array(out, f"train_recall/runs/{p:03d}/{name}"),
                                  kdalab.read_array(whole, f"train_recall/runs/{p:03d}/{name}")), (p, name)
        assert kdalab.read_attr(out, f"train_recall/runs/{p:03d}", "description") == \
            kdalab.read_attr(whole, f"train_recall/runs/{p:03d}", "description")
    with pytest.raises(kdalab.Error):
        kdalab.read_attr(out, "train_recall/runs", "shard_row_groups")


@pytest.mark.parametrize("case, says", [
    ("duplicated", "are both shard 1/3; give each shard once"),
    ("missing", "shard 3 of 3 missing"),
    ("foreign config", "has another config than"),
    ("foreign seed", "has seed 2"),
])
def test_merge_refuses_shards_of_another_run_or_not_covering_the_grid(tmp_path, no_torch, case, says):
    s = [write(tmp_path / f"s{i}.h5", "--shard", f"{i}/3") for i in (1, 2, 3)]
    if case == "duplicated":
        s.append(write(tmp_path / "again1.h5", "--shard", "1/3"))
    elif case == "missing":
        s = s[:2]
    elif case == "foreign config":
        s[2] = write(tmp_path / "other.h5", "--shard", "3/3", "--weight-decay", "0")
    else:
        s[2] = write(tmp_path / "other.h5", "--shard", "3/3", "--seed", "2")
    out = tmp_path / "merged.h5"
    r = merge(*s, "--out", out)
    assert r.returncode == 2 and says in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert not out.exists()


# ---- scripts/train_recall_shards.sh: a grid as one shard per run on one machine, then the merge

SHARDS = str(ROOT / "scripts" / "train_recall_shards.sh")


def shards_script(tmp_path, *args):
    env = dict(os.environ, PYTHON=sys.executable, KDALAB=kdalab_binary(),
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return subprocess.run(["bash", SHARDS, *args], capture_output=True, text=True, env=env, cwd=tmp_path)


def kdalab_binary():
    p = os.environ.get("KDALAB_BIN") or str(ROOT / "build" / "default" / "experiments" / "kdalab")
    if not os.path.exists(p):
        pytest.skip(f"no kdalab binary at {p} (set KDALAB_BIN)")
    return p


@pytest.mark.parametrize("args,says", [
    ([], "--grid is required"),
    (["--grid", "zoology-reduced"], "--out-dir is required"),
    (["--grid", "zoology-tiny", "--out-dir", "d"], "--grid 'zoology-tiny'; accepted:"),
    (["--grid", "zoology-reduced", "--out-dir", "d", "--jobs", "0"], "--jobs '0'; accepted"),
    (["--grid", "zoology-reduced", "--out-dir", "d", "--deadline", "-5"], "--deadline '-5'; accepted"),
    (["--grid", "zoology-reduced", "--out-dir", "d", "--fast"], "'--fast' is not an option"),
    (["--grid", "zoology-reduced", "--out-dir", "d", "--", "--lr", "0"], "--lr: 0.0 must be in (0, 1]"),
])
def test_shards_script_bad_usage_is_one_line_exit_2_and_runs_nothing(tmp_path, args, says):
    r = shards_script(tmp_path, *args)
    assert r.returncode == 2, r.stderr
    assert says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("value", ["abc", "0", "-2", "1.5", "4 4"])
def test_shards_script_a_bad_omp_num_threads_is_one_line_exit_2_and_runs_nothing(tmp_path, monkeypatch, value):
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    r = shards_script(tmp_path, "--grid", "zoology-reduced", "--out-dir", "d")
    assert r.returncode == 2, r.stderr
    assert f"OMP_NUM_THREADS '{value}'; accepted" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert os.listdir(tmp_path) == []


def test_shards_script_runs_every_shard_merges_and_a_second_call_runs_none(tmp_path):
    pytest.importorskip("torch")
    opts = ["--", "--mixers", "softmax", "--d-model", "32", "--seq-len", "32", "--kv-pairs", "4", "--vocab", "64",
            "--max-steps", "3", "--train-examples", "64", "--test-examples", "32", "--device", "cpu", "--threads", "1",
            "--quiet"]
    r = shards_script(tmp_path, "--grid", "zoology-reduced", "--out-dir", "out", "--jobs", "2", *opts)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 runs, one a shard; 0 done, 2 to run" in r.stdout and "2 of 2 shards done; merged" in r.stdout
    merged = tmp_path / "out" / "zoology-reduced.h5"
    assert merged.exists() and len(kdalab.read_array(str(merged), "train_recall/test_accuracy")) == 2
    r = shards_script(tmp_path, "--grid", "zoology-reduced", "--out-dir", "out", *opts)
    assert r.returncode == 0 and "2 done, 0 to run" in r.stdout, r.stdout + r.stderr
