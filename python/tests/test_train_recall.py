"""python -m kdalab.train_recall (python/kdalab/train_recall.py; docs/recall-training.md): bad options, training to
high accuracy, resumption, the KDA-family mixers' wiring and the figure scripts. Tests that train need torch and
skip without it (the project's CI has none); the others run everywhere."""
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import kdalab
from kdalab import train_recall as tr

ROOT = pathlib.Path(__file__).resolve().parents[2]
# a small MQAR problem softmax attention learns in a few hundred CPU steps
TINY = ["--vocab", "64", "--seq-len", "32", "--kv-pairs", "4", "--d-model", "32", "--batch-size", "32",
        "--train-examples", "1600", "--test-examples", "200", "--threads", "1", "--device", "cpu", "--quiet"]


def run_cli(argv, **kw):
    try:
        return tr.main(argv, **kw)
    except SystemExit as e:  # argparse's own errors
        return e.code


@pytest.mark.parametrize("argv, says", [
    (["--tasks", "copy"], "--tasks: 'copy' is unknown"),
    (["--mixers", "mamba2"], "--mixers: 'mamba2' is unknown"),
    (["--lr", "0"], "--lr: 0.0 must be in (0, 1]"),
    (["--lr", "fast"], "argument --lr: 'fast' is not a comma-separated list of numbers"),
    (["--seq-len", "63"], "--seq-len: 63 is not an even integer"),
    (["--seq-len", "64", "--kv-pairs", "17"], "--kv-pairs: 17 pairs do not fit L = 64"),
    (["--tasks", "stack", "--vocab", "100"], "--vocab: 100 leaves no value tokens for the Stack task"),
    (["--grid", "zoology-tiny"], "argument --grid: invalid choice"),
    (["--resume"], "--resume: no checkpoint"),
    (["--seed", "-1"], "--seed: -1 is not an integer in [0, 2^64 - 1]"),
    (["--seed", str(2**64)], "--seed: 18446744073709551616 is not an integer in [0, 2^64 - 1]"),
    (["--seq-len", "1048576", "--kv-pairs", "4"],
     "--train-examples: 3000 examples of --seq-len 1048576 are 3145728000 tokens; accepted: examples x seq_len <= "
     "268435456"),
    (["--checkpoint", ""], "--checkpoint '': give a file name"),
    (["--threads", "1000000000"], "--threads: 1000000000 is not an integer in [0, 1024]"),
    (["--lr", "1e-3,2e-3,1e-3"], "--lr: 0.001 is given twice; give each value once"),
    (["--tasks", "mqar,stack,mqar"], "--tasks: mqar is given twice"),
    (["--seq-len", "64,64"], "--seq-len: 64 is given twice"),
    (["--mixers", "softmax,kda", "--head-dim", "257"],
     "--head-dim: head dim 257 is over 256 for --mixers kda and does not split into 2 equal heads; accepted: a head "
     "dim <= 256, or one divisible by ceil(head dim / 256)"),
    (["--mixers", "deltanet", "--d-model", "514"], "--d-model 514 / --heads 1: head dim 514 is over 256"),
    (["--heads", "3", "--head-dim", "-5"], "--head-dim: -5 must be >= 1"),
    (["--tasks", "palindrome", "--seq-len", "4", "--kv-pairs", "9"], "--kv-pairs: given, but --tasks palindrome has no"),
    (["--tasks", "palindrome", "--seq-len", "6", "--vocab", "3"], "--vocab: 3 gives the Palindrome task 1 token"),
    (["--mixers", "mla", "--mla-latent", "1000000000"], "--mla-latent: 1000000000 is not in [1, 65536]"),
    (["--lr", "1", "--weight-decay", "100"], "--lr x --weight-decay: 1 x 100 = 100; accepted: < 1"),
    (["--heads", "1000", "--head-dim", "1000"],
     "--heads x --head-dim: 1000 x 1000 = 1000000 is not in [1, 65536] (the mixer's width, bounded as --d-model)"),
    (["--lr", "1e-400"], "argument --lr: '1e-400' underflows to 0 in double precision"),
    (["--weight-decay", "1e-999"], "argument --weight-decay: '1e-999' underflows to 0 in double precision"),
    (["--g-min", "abc"], "argument --g-min: 'abc' is not a number"),
])
def test_bad_options_are_one_line_exit_2_and_write_nothing(tmp_path, capsys, argv, says):
    out = tmp_path / "r.h5"
    assert run_cli(argv + ["--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1 and err.startswith("python -m kdalab.train_recall: error: ")
    assert list(tmp_path.iterdir()) == []


def test_an_existing_out_is_kept_without_force(tmp_path, capsys):
    out = tmp_path / "r.h5"
    out.write_text("keep")
    assert run_cli(["--out", str(out)]) == 2
    assert "exists; it is replaced only with --force" in capsys.readouterr().err and out.read_text() == "keep"


def test_a_given_out_or_checkpoint_folder_must_exist_and_they_differ(tmp_path, capsys):
    for argv, says in ((["--out", str(tmp_path / "no" / "r.h5")], f"--out {tmp_path}/no/r.h5: its folder "),
                       (["--out", str(tmp_path / "r.h5"), "--checkpoint", str(tmp_path / "no" / "c")],
                        f"--checkpoint {tmp_path}/no/c: its folder "),
                       (["--out", str(tmp_path)], f"--out {tmp_path} is a folder; give a file name"),  # not --force
                       (["--out", str(tmp_path), "--force"], f"--out {tmp_path} is a folder; give a file name"),
                       (["--out", str(tmp_path / "r.h5"), "--checkpoint", str(tmp_path / "." / "r.h5")],
                        "is the --out file; give another name"),
                       # the results writer's checks, before training (without torch too): found after it, they were
                       # a traceback
                       (["--out", str(tmp_path / ("r" * 240 + ".h5"))], "the file name is too long")):
        assert run_cli(argv) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1
        assert list(tmp_path.iterdir()) == []


def test_help_names_every_option_and_the_exit_codes():
    r = subprocess.run([sys.executable, "-m", "kdalab.train_recall", "--help"], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert r.returncode == 0
    options = [s for action in tr.parser()._actions for s in action.option_strings]
    assert len(options) >= 39
    for opt in options:
        assert opt in r.stdout, opt
    text = " ".join(r.stdout.split())
    assert "Exit codes: 0 done" in text and "130 / 143 stopped by SIGINT / SIGTERM" in text


def test_grids_state_their_run_counts():
    counts = {g: len(tr.runs_of(tr.resolve(tr.parser().parse_args(["--grid", g])))) for g in tr.GRIDS}
    assert counts == {"zoology": 3 * 4 * 5 * 4, "zoology-reduced": 54, "kimi": 3 * 4 * 4 * 4, "kimi-reduced": 24}
    # an option given with a grid replaces the grid's value
    cfg = tr.resolve(tr.parser().parse_args(["--grid", "zoology-reduced", "--mixers", "softmax"]))
    assert len(tr.runs_of(cfg)) == 18 and cfg["vocab"] == [8192] and tr.steps_per_run(cfg) == 2496


def test_kda_family_heads_over_256_split_and_softmax_keeps_the_given_heads():
    """kdalab's head rule (docs/recall-training.md, Head sizes): Zoology's d_model 512 with one head is 2 heads of 256
    for the KDA-family mixers (chunk_kda takes key heads <= 256), 1 head of 512 for softmax and MLA."""
    cfg = tr.resolve(tr.parser().parse_args(["--grid", "zoology"]))
    shapes = {(m, d): tr.head_shape(cfg, m, d) for m in tr.MIXERS for d in cfg["d_model"]}
    for m in tr.MIXERS:
        assert [shapes[m, d] for d in (64, 128, 256)] == [(1, 64), (1, 128), (1, 256)], m
        assert shapes[m, 512] == ((2, 256) if m in tr.KERNEL_MIXERS else (1, 512)), m
    cfg = tr.resolve(tr.parser().parse_args(["--mixers", "kda", "--heads", "2", "--head-dim", "600"]))
    assert tr.head_shape(cfg, "kda", 64) == (6, 200)  # ceil(600 / 256) = 3 heads of 200 per given head


# ---- training (torch)


def test_softmax_attention_learns_tiny_mqar_on_the_cpu(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "r.h5"
    assert tr.main(TINY + ["--epochs", "8", "--lr", "3e-3", "--out", str(out)]) == 0
    acc = kdalab.read_array(str(out), "train_recall/test_accuracy")
    assert acc.shape == (1,) and acc[0] >= 0.9, acc
    assert kdalab.read_attr(str(out), "/", "software") == "kdalab"
    assert kdalab.read_attr(str(out), "train_recall", "torch_device") == "cpu"
    assert len(kdalab.read_array(str(out), "train_recall/runs/000/loss")) == 8 * 50
    assert not (tmp_path / "r.h5.ckpt").exists()


def test_the_lm_head_at_the_scored_positions_gives_the_full_logits_rows_and_the_same_loss():
    """The model's logits at the scored positions alone (model(tokens, scored)) are the full logits' rows there, and
    the loss over them is the ignore_index loss over the full logits (train_recall computes the head only there)."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    cfg = tr.resolve(tr.parser().parse_args(["--mixers", "softmax"]))
    torch.manual_seed(3)
    for mixer in ("softmax", "mla"):
        model = tr.build_model(tr.Run("mqar", 32, 4, 256, 32, mixer, 1e-3), cfg, None)
        x = torch.randint(0, 256, (3, 32))
        y = torch.full((3, 32), kdalab.IGNORE_INDEX)
        y[:, 5::7] = torch.randint(0, 256, (3, 4))
        scored = y != kdalab.IGNORE_INDEX
        with torch.no_grad():
            full, part = model(x).float(), model(x, scored).float()
        assert part.shape == (int(scored.sum()), 256)
        assert torch.allclose(part, full[scored], rtol=1e-5, atol=1e-6), mixer
        loss_full = F.cross_entropy(full.reshape(-1, 256), y.reshape(-1), ignore_index=kdalab.IGNORE_INDEX)
        assert torch.allclose(F.cross_entropy(part, y[scored]), loss_full, rtol=1e-5), mixer
        with torch.no_grad():  # the same positions as int64 indices into the flattened [B, T] (the training step's form)
            by_index = model(x, scored.flatten().nonzero().squeeze(1)).float()
        assert torch.equal(by_index, part), mixer


def test_a_training_batchs_scored_positions_found_on_the_host_are_the_masks_positions_in_order(tmp_path):
    """Trainer.scored_batch (host-side, no device sync) gives the flattened positions of the batch's scored targets
    and those targets in row-major order, the rows a boolean mask of the batch selects."""
    torch = pytest.importorskip("torch")
    cfg = tr.resolve(tr.parser().parse_args(["--tasks", "stack", "--seq-len", "32", "--vocab", "256",
                                             "--train-examples", "128", "--batch-size", "16"]))
    trainer = tr.Trainer(cfg, torch.device("cpu"), lambda s: None, str(tmp_path / "x.ckpt"))
    run = tr.runs_of(cfg)[0]
    x_all, y_all = trainer.data(run)["train"]
    for step in (0, 5, 9):
        idx_host, idx = trainer.batch_indices(run, step)
        assert torch.equal(idx_host, idx)
        y = y_all[idx].long()
        mask = y != kdalab.IGNORE_INDEX
        pos, target = trainer.scored_batch(idx_host)
        assert torch.equal(pos, mask.flatten().nonzero().squeeze(1))
        assert torch.equal(target, y[mask])
        assert pos.dtype == target.dtype == torch.int64 and 0 < len(pos) < y.numel()


def test_the_short_convolution_as_one_grouped_conv1d_equals_the_shifted_sum():
    """ShortConv's two forms (the grouped conv1d the GPU runs, the shifted sum the CPU runs) give the same model
    output and the same gradients."""
    torch = pytest.importorskip("torch")
    cfg = tr.resolve(tr.parser().parse_args(["--mixers", "softmax"]))
    for mixer in ("softmax", "mla"):
        torch.manual_seed(5)
        model = tr.build_model(tr.Run("mqar", 32, 4, 256, 32, mixer, 1e-3), cfg, None)
        convs = [m for m in model.modules() if type(m).__name__ == "ShortConv"]
        assert convs, "the model has short convolutions (--short-conv on, the default)"
        with torch.no_grad():  # away from the identity start, so that every tap matters
            for c in convs:
                c.w.normal_()
        x = torch.randint(0, 256, (3, 32))
        outs, grads = [], []
        for grouped in (False, True):
            for c in convs:
                c.grouped = grouped
            model.zero_grad()
            out = model(x).float()
            out.square().mean().backward()
            outs.append(out.detach())
            grads.append([c.w.grad.clone() for c in convs])
        assert torch.allclose(outs[0], outs[1], rtol=1e-4, atol=1e-5), mixer
        for g0, g1 in zip(*grads):
            assert torch.allclose(g0, g1, rtol=1e-4, atol=1e-6), mixer
        # under bf16 autocast both forms hand fp32 to what follows (bf16 x times fp32 w), so the KDA kernels are fed
        # the same dtypes whichever form runs
        h = torch.randn(2, 8, convs[0].w.shape[0]).bfloat16()
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            dtypes = set()
            for grouped in (False, True):
                convs[0].grouped = grouped
                dtypes.add(convs[0](h).dtype)
        assert dtypes == {torch.float32}, dtypes


def test_a_split_with_no_scored_position_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys):
    """A stack sequence of 4 tokens (two operations, the first a push) pops nothing: no loss and no accuracy to
    measure, refused before a NaN loss could reach the model."""
    pytest.importorskip("torch")
    out = tmp_path / "r.h5"
    argv = ["--tasks", "stack", "--seq-len", "4", "--vocab", "256", "--train-examples", "64", "--test-examples", "32",
            "--epochs", "1", "--batch-size", "32", "--out", str(out)]
    assert tr.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--tasks stack at --seq-len 4: the train split (64 examples) has no scored position" in err[0]
    assert list(tmp_path.iterdir()) == []


def test_a_split_with_no_scored_position_is_found_before_any_run_trains(tmp_path, capsys):
    """The check runs over every data cell first: a later run's empty split stops the call before the first run
    trains (no progress line, no checkpoint left behind)."""
    pytest.importorskip("torch")
    out = tmp_path / "r.h5"
    argv = ["--tasks", "stack", "--seq-len", "64,4", "--vocab", "256", "--train-examples", "64", "--test-examples",
            "32", "--epochs", "1", "--batch-size", "32", "--checkpoint-every", "1", "--device", "cpu", "--out",
            str(out)]
    assert tr.main(argv) == 2
    cap = capsys.readouterr()
    err = cap.err.strip().splitlines()
    assert len(err) == 1 and "--tasks stack at --seq-len 4: the train split (64 examples) has no scored position" in err[0]
    assert "step" not in cap.out and list(tmp_path.iterdir()) == []


def test_a_checkpoint_path_that_is_a_fifo_is_refused_and_left_alone(tmp_path, capsys):
    fifo = tmp_path / "ck"
    os.mkfifo(fifo)
    for extra in ([], ["--force"]):
        assert tr.main(TINY + ["--out", str(tmp_path / "r.h5"), "--checkpoint", str(fifo)] + extra) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"--checkpoint {fifo} is not a regular file" in err[0], err
        assert fifo.exists() and not fifo.is_file()
    assert not (tmp_path / "r.h5").exists()


def test_a_checkpoint_write_that_fails_in_torch_is_one_line_exit_5(tmp_path, capsys, monkeypatch):
    """torch.save reports a short write (a full disk) as RuntimeError: the environment failed (exit 5), one line."""
    torch = pytest.importorskip("torch")

    def short_write(*args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:671] . unexpected pos 9792 vs 9686")
    monkeypatch.setattr(torch, "save", short_write)
    out = tmp_path / "r.h5"
    assert tr.main(TINY + ["--out", str(out), "--checkpoint-every", "2"]) == 5
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot write the checkpoint" in err[0] and "unexpected pos" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_checkpoint_with_a_damaged_run_state_is_one_line_exit_2(tmp_path, capsys):
    """A checkpoint that unpickles but whose model, optimizer, schedule or curves do not fit the run."""
    torch = pytest.importorskip("torch")
    out = tmp_path / "r.h5"
    ckpt = tmp_path / "r.h5.ckpt"
    assert tr.main(TINY + ["--out", str(out), "--stop-after", "2"]) == 0
    good = torch.load(ckpt, weights_only=True)
    damages = {"a model weight missing": lambda c: c["model"].pop("emb.weight"),
               "no optimizer state": lambda c: c.__setitem__("opt", {}),
               "curves without seconds": lambda c: c["curves"].pop("seconds"),
               "a step past the run's end": lambda c: c.__setitem__("step", 10 ** 6),
               "curves shorter than the step": lambda c: c["curves"].__setitem__("loss", [])}
    for what, damage in damages.items():
        state = {**good, "current": {**good["current"], "model": dict(good["current"]["model"]),
                                     "curves": dict(good["current"]["curves"])}}
        damage(state["current"])
        torch.save(state, ckpt)
        before = ckpt.read_bytes()
        assert tr.main(TINY + ["--out", str(out), "--resume"]) == 2, what
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"--resume: {ckpt} holds" in err[0], (what, err)
        assert ckpt.read_bytes() == before and not out.exists(), what


def test_sigint_before_training_is_one_line_exit_130(tmp_path, capsys, monkeypatch):
    """SIGINT while the program imports torch or makes the data (before the training loop's handler): one line."""
    def interrupted():
        raise KeyboardInterrupt
    monkeypatch.setattr(tr, "_torch", interrupted)
    assert tr.main(TINY + ["--out", str(tmp_path / "r.h5")]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "interrupted before training" in err[0], err
    assert list(tmp_path.iterdir()) == []


def test_a_foreign_pickle_as_the_checkpoint_is_exactly_one_line(tmp_path, capsys):
    """torch.load warns in two lines about a foreign pickle before it fails: the user sees the one error line only."""
    pytest.importorskip("torch")
    import pickle
    ckpt = tmp_path / "r.h5.ckpt"
    ckpt.write_bytes(pickle.dumps({"not": "a checkpoint"}, protocol=4))
    r = subprocess.run([sys.executable, "-m", "kdalab.train_recall"] + TINY + ["--out", str(tmp_path / "r.h5"),
                       "--resume"], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(err) == 1 and "--resume" in err[0], err


def test_the_summary_says_when_a_run_diverged():
    run = tr.Run("mqar", 32, 4, 64, 32, "softmax", 1e-3)
    res = [tr.Result(run, "k", 2, [1.0, float("nan")], [0.0, 0.0], [], [], 0.0, 1.0, 0),
           tr.Result(tr.Run("mqar", 32, 4, 64, 64, "softmax", 1e-3), "k", 2, [1.0, 0.5], [0.0, 0.0], [], [], 0.5, 1.0, 0)]
    text = tr.summary(res).splitlines()
    assert "diverged: the last loss is not finite" in text[1] and "diverged" not in text[2], text


def test_a_resumed_run_equals_an_uninterrupted_one(tmp_path):
    pytest.importorskip("torch")
    opts = TINY + ["--epochs", "1", "--lr", "1e-3,3e-3", "--checkpoint-every", "7"]
    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    assert tr.main(opts + ["--out", str(a)]) == 0
    assert tr.main(opts + ["--out", str(b), "--stop-after", "70"]) == 0  # inside the second run (50 steps each)
    assert not b.exists() and (tmp_path / "b.h5.ckpt").exists()
    assert tr.main(opts + ["--out", str(b), "--resume", "--stop-after", "0"]) == 0
    for run in ("000", "001"):
        for name in ("loss", "train_accuracy", "eval_accuracy"):
            x = kdalab.read_array(str(a), f"train_recall/runs/{run}/{name}")
            y = kdalab.read_array(str(b), f"train_recall/runs/{run}/{name}")
            assert np.array_equal(x, y), (run, name)
    assert not (tmp_path / "b.h5.ckpt").exists()


def test_a_resume_with_other_options_is_refused(tmp_path, capsys):
    pytest.importorskip("torch")
    opts = TINY + ["--epochs", "1", "--out", str(tmp_path / "r.h5")]
    assert tr.main(opts + ["--stop-after", "3"]) == 0
    assert tr.main(opts + ["--resume", "--lr", "1e-2"]) == 2
    assert "was made with other options (lr)" in capsys.readouterr().err


def test_the_default_out_folder_is_made(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)
    assert tr.main(TINY + ["--max-steps", "2"]) == 0
    assert sorted(os.listdir(tmp_path / "results")) == ["train_recall.h5"]


def checkpoint_of_a_stopped_run(tmp_path):
    opts = TINY + ["--epochs", "1", "--out", str(tmp_path / "r.h5")]
    assert tr.main(opts + ["--stop-after", "3"]) == 0
    return opts, tmp_path / "r.h5.ckpt"


class _RunsCode:
    def __reduce__(self):
        return (os.mkdir, (os.environ["KDALAB_TEST_MARK"],))


def test_a_resume_from_a_damaged_or_foreign_checkpoint_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    torch = pytest.importorskip("torch")
    opts, ckpt = checkpoint_of_a_stopped_run(tmp_path)
    good = torch.load(ckpt, weights_only=True)
    mark = tmp_path / "code-ran"
    monkeypatch.setenv("KDALAB_TEST_MARK", str(mark))

    def other_run(s):
        s["current"]["index"] = 7
        return s

    for content, says in ((b"not a checkpoint", "is not a readable checkpoint of python -m kdalab.train_recall "
                                                "(torch.load: UnpicklingError)"),
                          (b"", "(torch.load: EOFError)"),
                          ([1, 2, 3], "is not a checkpoint of python -m kdalab.train_recall (no options recorded)"),
                          ({"config": _RunsCode()}, "(torch.load: UnpicklingError)"),  # a pickle runs no code
                          (other_run(good), "does not hold a run of these options")):
        if isinstance(content, bytes):
            ckpt.write_bytes(content)
        else:
            torch.save(content, ckpt)
        before = ckpt.read_bytes()
        assert tr.main(opts + ["--resume"]) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1 and "start again with --force" in err
        assert ckpt.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["r.h5.ckpt"]
        assert not mark.exists()


def test_an_unwritable_folder_fails_before_training_and_a_failed_checkpoint_write_is_exit_5(tmp_path, capsys,
                                                                                             monkeypatch):
    pytest.importorskip("torch")
    out = tmp_path / "r.h5"
    real_access = os.access
    monkeypatch.setattr(tr.os, "access", lambda p, m: False if str(p) == str(tmp_path) else real_access(p, m))
    assert tr.main(TINY + ["--out", str(out)]) == 5  # found before any training (as root, access is mocked)
    err = capsys.readouterr().err
    assert f"cannot write '{out}': folder '{tmp_path}' is not writable" in err and err.count("\n") == 1
    monkeypatch.setattr(tr.os, "access", real_access)

    def no_space(obj, path):
        raise OSError(28, "No space left on device", path)

    monkeypatch.setattr(tr, "_atomic_torch_save", no_space)
    assert tr.main(TINY + ["--out", str(out), "--checkpoint-every", "2"]) == 5
    err = capsys.readouterr().err
    assert "No space left on device" in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_a_signal_stops_at_a_step_with_the_checkpoint_saved_and_no_results_file(tmp_path, signame):
    pytest.importorskip("torch")
    import signal
    import time
    out = tmp_path / "r.h5"
    argv = [a for a in TINY if a != "--quiet"] + ["--epochs", "100", "--log-every", "1", "--checkpoint-every", "0",
                                                  "--out", str(out)]
    p = subprocess.Popen([sys.executable, "-m", "kdalab.train_recall", *argv], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    for line in p.stdout:  # training has begun
        if ": step 3/" in line:
            break
    time.sleep(0.2)
    p.send_signal(getattr(signal, signame))
    _, err = p.communicate(timeout=120)
    num = getattr(signal, signame).value
    assert p.returncode == 128 + num, err
    assert err.startswith(f"python -m kdalab.train_recall: interrupted by {signame} at step ") and err.count("\n") == 1
    assert "no results file was written" in err and "continue with --resume" in err
    assert sorted(os.listdir(tmp_path)) == ["r.h5.ckpt"]  # no results file, no temporary
    import torch
    state = torch.load(tmp_path / "r.h5.ckpt", weights_only=True)
    step = state["current"]["step"]
    assert step >= 3 and len(state["current"]["curves"]["loss"]) == step
    assert tr.main(TINY + ["--epochs", "100", "--out", str(out), "--resume", "--stop-after", "2"]) == 0
    state = torch.load(tmp_path / "r.h5.ckpt", weights_only=True)
    assert state["current"]["step"] == step + 2


def test_kernel_mixers_on_the_cpu_cannot_run_here(tmp_path, capsys):
    pytest.importorskip("torch")
    assert tr.main(TINY + ["--mixers", "softmax,kda", "--out", str(tmp_path / "r.h5")]) == 3
    err = capsys.readouterr().err
    assert "--mixers kda: it runs kdalab's CUDA KDA kernel" in err and "needs a CUDA device" in err
    assert list(tmp_path.iterdir()) == []


def reference_kda(q, k, v, g, beta, scale):
    """The KDA recurrence (docs/equations.md section 1) in plain torch, fla's convention: S_t = Diag(e^g_t) S_{t-1}
    + beta_t k_t (v_t - (Diag(e^g_t) S_{t-1})^T k_t)^T, o_t = scale S_t^T q_t."""
    import torch
    B, T, H, K = q.shape
    S = q.new_zeros(B, H, K, v.shape[-1])
    out = []
    for t in range(T):
        S = S * g[:, t].exp()[..., None]
        kv = (S * k[:, t, ..., None]).sum(-2)
        S = S + beta[:, t, :, None, None] * k[:, t, ..., None] * (v[:, t] - kv)[..., None, :]
        out.append(scale * (S * q[:, t, ..., None]).sum(-2))
    return torch.stack(out, 1), S


def test_out_of_memory_is_one_line_exit_5_and_writes_no_results_file(tmp_path, capsys):
    """A run that runs out of memory (here a kernel mixer that raises torch's error) ends with one line naming the run
    and what to make smaller, exit 5 (the environment), and no results file; the earlier traceback is gone."""
    torch = pytest.importorskip("torch")

    def oom(*args, **kw):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB")

    out = tmp_path / "r.h5"
    rc = tr.main(TINY + ["--mixers", "kda", "--seq-len", "16", "--kv-pairs", "2", "--max-steps", "2", "--out",
                         str(out)], kernels={"kda": (oom, "oom")})
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 5 and len(err) == 1, err
    assert "out of memory in run 1 of 1 (mqar L=16" in err[0] and "a smaller --d-model" in err[0], err
    assert not out.exists()


def test_kernel_mixers_train_through_a_given_chunked_kda(tmp_path):
    """The wiring of the KDA, Gated DeltaNet and DeltaNet mixers (gates, shapes, the kernel's name in the file),
    through the reference recurrence in place of kdalab.torch.chunk_kda."""
    pytest.importorskip("torch")
    out = tmp_path / "r.h5"
    ref = (reference_kda, "reference_kda")
    mixers = ["kda", "gated_deltanet", "deltanet"]
    assert tr.main(TINY + ["--mixers", ",".join(mixers), "--seq-len", "16", "--kv-pairs", "2", "--max-steps", "4",
                           "--out", str(out)], kernels={m: ref for m in mixers}) == 0
    assert kdalab.read_attr(str(out), "train_recall/runs/000", "kernel") == "reference_kda"
    assert list(kdalab.read_array(str(out), "train_recall/heads")) == [1, 1, 1]
    assert list(kdalab.read_array(str(out), "train_recall/head_dim")) == [32, 32, 32]
    loss = kdalab.read_array(str(out), "train_recall/runs/001/loss")
    assert loss.shape == (4,) and np.isfinite(loss).all()


def test_gates_stay_within_their_bounds():
    torch = pytest.importorskip("torch")
    seen = {}

    def spy(q, k, v, g, beta, scale):
        seen["g"], seen["beta"] = g, beta
        return reference_kda(q, k, v, g, beta, scale)

    cfg = tr.resolve(tr.parser().parse_args(["--g-min", "-3", "--heads", "2"]))
    for mixer in ("kda", "gated_deltanet"):
        run = tr.Run("mqar", 16, 2, 64, 32, mixer, 1e-3)
        tr.build_model(run, cfg, spy)(torch.randint(0, 64, (2, 16)))
        g = seen["g"]
        assert g.shape == (2, 16, 2, 16) and (g <= 0).all() and (g >= -3).all()
        if mixer == "gated_deltanet":  # one value per head, broadcast over the key channels
            assert (g == g[..., :1]).all()
        assert ((seen["beta"] > 0) & (seen["beta"] < 1)).all()
    cfg = tr.resolve(tr.parser().parse_args(["--mixers", "kda"]))
    tr.build_model(tr.Run("mqar", 4, 1, 64, 512, "kda", 1e-3), cfg, spy)(torch.randint(0, 64, (1, 4)))
    assert seen["g"].shape == (1, 4, 2, 256)  # d_model 512, one head: 2 heads of 256 reach the chunked KDA


# ---- figures (Debian's /usr/bin/python3 with h5py and matplotlib)


def figure(script, *args):
    py = "/usr/bin/python3"
    if not os.path.exists(py) or subprocess.run([py, "-c", "import h5py, matplotlib"]).returncode != 0:
        pytest.skip("/usr/bin/python3 lacks h5py or matplotlib")
    return subprocess.run([py, str(ROOT / "scripts" / script), *args], capture_output=True, text=True)


@pytest.mark.parametrize("script", ["fig_train_zoology.py", "fig_train_kimi.py"])
def test_figures_from_the_checked_in_files_skip_when_there_are_none(script, tmp_path):
    r = figure(script, "--out-dir", str(tmp_path))
    if list((ROOT / "data" / "recall_train").glob("*.h5")):
        assert r.returncode in (0, 3), r.stderr
    else:
        assert r.returncode == 3 and "skip: no results files under data/recall_train/" in r.stderr


def test_kimi_figure_draws_the_checked_in_reduced_grid_and_names_its_card(tmp_path):
    files = sorted(f for f in (ROOT / "data" / "recall_train").glob("*.h5") if "kimi" in f.name)
    if not files:
        pytest.skip("no Kimi-grid results file under data/recall_train/")
    # without a file: every Kimi-grid file of data/recall_train, one title note for all of them
    r = figure("fig_train_kimi.py", "--dump", str(tmp_path / "k.json"), "--out-dir", str(tmp_path))
    assert r.returncode == 0, r.stderr
    count = ("import h5py, sys; print(sum(len(h5py.File(f, 'r')['train_recall']['test_accuracy']) "
             "for f in sys.argv[1:]))")  # the figure's interpreter has h5py (figure() checked it)
    runs = int(subprocess.run(["/usr/bin/python3", "-c", count, *map(str, files)], capture_output=True, text=True,
                              check=True).stdout)
    import json
    dump = json.loads((tmp_path / "k.json").read_text())
    assert [a["title"] for a in dump["axes"]] == ["Palindrome (d_model 256)", "MQAR (d_model 256)", "Stack (d_model 256)"]
    many = f" in {len(files)} files" if len(files) > 1 else ""
    assert f"reduced grid: {runs} runs{many}; 1500 steps a run; trained on NVIDIA" in dump["suptitle"]
    assert dump["suptitle"].count("trained on") == 1
    for ax in dump["axes"]:  # KDA and Gated DeltaNet side by side at every length, and any other mixer of the files
        names = {ln["label"].lstrip("_") for ln in ax["lines"]}
        assert {"KDA", "kda"} & names and {"Gated DeltaNet", "gated_deltanet"} & names, names
        assert all(ln["x"] == [256.0, 1024.0] for ln in ax["lines"] if ln["label"].lstrip("_") in
                   ("KDA", "kda", "Gated DeltaNet", "gated_deltanet", "softmax attention", "softmax"))


def test_figures_refuse_a_damaged_train_recall_table_in_one_line(tmp_path):
    rows = [("stack", L, 0, 256, m, lr, 0.5) for L in (256, 1024) for m in ("kda", "gated_deltanet") for lr in (5e-4, 1e-3)]
    for what, acc in (("NaN", float("nan")), ("above 1", 1.5), ("negative", -5.0)):
        bad = [r[:6] + (acc if i == 0 else r[6],) for i, r in enumerate(rows)]
        path = tmp_path / f"a-{len(what)}.h5"
        synthetic_results(path, "kimi-reduced", bad)
        r = figure("fig_train_kimi.py", str(path), "--out-dir", str(tmp_path / "fig"))
        assert r.returncode == 2 and "test_accuracy holds 1 value(s) outside [0, 1]" in r.stderr, (what, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "fig").exists(), what


def test_figures_refuse_train_recall_columns_of_unequal_length_in_one_line(tmp_path):
    rows = [("stack", L, 0, 256, "kda", 1e-3, 0.5) for L in (256, 1024)]
    path = tmp_path / "a.h5"
    synthetic_results(path, "kimi-reduced", rows)
    cut = subprocess.run(["/usr/bin/python3", "-c", "import h5py, sys; f = h5py.File(sys.argv[1], 'r+'); "
                          "v = f['train_recall/test_accuracy'][:1]; del f['train_recall/test_accuracy']; "
                          "f['train_recall/test_accuracy'] = v", str(path)], capture_output=True, text=True)
    if cut.returncode != 0:
        pytest.skip("/usr/bin/python3 lacks h5py")
    r = figure("fig_train_kimi.py", str(path), "--out-dir", str(tmp_path / "fig"))
    assert r.returncode == 2 and "the train_recall columns differ in length" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "fig").exists()


def synthetic_results(path, grid, rows):
    """A results file with the train_recall table of a finished run, as train_recall writes it (no training)."""
    n = len(rows)
    with kdalab.ResultsFile(str(path), config="{}", seed="1") as f:
        f.group("train_recall", "test")
        f.attr("train_recall", "grid", grid)
        f.attr("train_recall", "note", f"reduced grid: {n} runs" if grid.endswith("-reduced") else f"{n} runs")
        cols = ("task", "seq_len", "kv_pairs", "d_model", "mixer", "lr", "test_accuracy")
        f.write_table("train_recall", [(c, "1", c, [r[i] for r in rows]) for i, c in enumerate(cols)])


def test_zoology_figure_draws_the_best_learning_rate_per_width(tmp_path):
    rows = [("mqar", L, L // 16, d, m, lr, acc * (1 if lr == 1e-3 else 0.5))
            for L in (64, 128) for d in (64, 128) for m, acc in (("softmax", 1.0), ("kda", 0.5)) for lr in (1e-3, 1e-2)]
    synthetic_results(tmp_path / "z.h5", "zoology-reduced", rows)
    r = figure("fig_train_zoology.py", str(tmp_path / "z.h5"), "--dump", str(tmp_path / "z.json"))
    assert r.returncode == 0, r.stderr
    import json
    dump = json.loads((tmp_path / "z.json").read_text())
    assert "reduced grid: 16 runs" in dump["suptitle"]
    assert [a["title"] for a in dump["axes"]] == ["L = 64, N = 4", "L = 128, N = 8"]
    lines = {ln["label"]: ln for ln in dump["axes"][0]["lines"] if not ln["label"].startswith("_")}
    assert lines["softmax attention"]["y"] == [1.0, 1.0] and lines["KDA"]["y"] == [0.5, 0.5]
    # a Zoology grid is not drawn in the Kimi layout
    r = figure("fig_train_kimi.py", str(tmp_path / "z.h5"), "--dump", str(tmp_path / "k.json"))
    assert r.returncode == 3 and "a Zoology grid (zoology-reduced): fig_train_zoology.py draws it" in r.stderr


def test_kimi_figure_draws_the_best_learning_rate_per_length_and_skips_a_file_with_one_length(tmp_path):
    rows = [(t, L, 0, 256, m, lr, acc * (L == 256) + 0.1 * (lr == 5e-4)) for t in ("palindrome", "stack")
            for L in (256, 1024) for m, acc in (("kda", 0.8), ("gated_deltanet", 0.4)) for lr in (5e-4, 1e-3)]
    synthetic_results(tmp_path / "kr.h5", "kimi-reduced", rows)
    r = figure("fig_train_kimi.py", str(tmp_path / "kr.h5"), "--dump", str(tmp_path / "kr.json"))
    assert r.returncode == 0, r.stderr
    import json
    dump = json.loads((tmp_path / "kr.json").read_text())
    assert [a["title"] for a in dump["axes"]] == ["Palindrome (d_model 256)", "Stack (d_model 256)"]
    lines = {ln["label"]: ln for ln in dump["axes"][1]["lines"]}  # legend labels only in the first panel
    assert lines["_kda"]["x"] == [256.0, 1024.0] and lines["_kda"]["y"] == pytest.approx([0.9, 0.1])
    assert lines["_gated_deltanet"]["y"] == pytest.approx([0.5, 0.1])
    assert "reduced grid: 16 runs" in dump["suptitle"]
    synthetic_results(tmp_path / "k.h5", "none", [("stack", 256, 0, 256, "kda", 1e-3, 0.9)])
    r = figure("fig_train_kimi.py", str(tmp_path / "k.h5"), "--out-dir", str(tmp_path / "fig"))
    assert r.returncode == 3 and "no task run at two or more sequence lengths" in r.stderr
    assert not (tmp_path / "fig").exists()


def figure_in(folder, script, *args):
    """A figure script drawing from `folder` in place of data/recall_train (KDALAB_RECALL_TRAIN_DIR)."""
    py = "/usr/bin/python3"
    if not os.path.exists(py) or subprocess.run([py, "-c", "import h5py, matplotlib"]).returncode != 0:
        pytest.skip("/usr/bin/python3 lacks h5py or matplotlib")
    env = dict(os.environ, KDALAB_RECALL_TRAIN_DIR=str(folder))
    return subprocess.run([py, str(ROOT / "scripts" / script), *args], capture_output=True, text=True, env=env)


KIMI_ROWS = [(t, L, 0, 256, m, lr, 0.5) for t in ("palindrome", "stack") for L in (256, 1024)
             for m in ("kda", "gated_deltanet") for lr in (5e-4, 1e-3)]


def test_figure_dump_never_replaces_a_results_file(tmp_path):
    synthetic_results(tmp_path / "k.h5", "kimi-reduced", KIMI_ROWS)
    synthetic_results(tmp_path / "other.h5", "kimi-reduced", KIMI_ROWS)
    before = {p: (tmp_path / p).read_bytes() for p in ("k.h5", "other.h5")}
    for dump, says in (("k.h5", "is a results file this figure reads"), ("other.h5", "is an HDF5 file")):
        r = figure("fig_train_kimi.py", str(tmp_path / "k.h5"), "--dump", str(tmp_path / dump))
        assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    # from the data folder too: the dump may not be one of the files it reads
    r = figure_in(tmp_path, "fig_train_kimi.py", "--dump", str(tmp_path / "other.h5"))
    assert r.returncode == 2 and "is a results file this figure reads" in r.stderr, r.stderr
    assert {p: (tmp_path / p).read_bytes() for p in before} == before
    assert sorted(os.listdir(tmp_path)) == ["k.h5", "other.h5"]


def test_figure_outputs_are_checked_before_anything_is_written(tmp_path):
    synthetic_results(tmp_path / "k.h5", "kimi-reduced", KIMI_ROWS)
    (tmp_path / "a-file").write_text("x")
    r = figure("fig_train_kimi.py", str(tmp_path / "k.h5"), "--dump", str(tmp_path / "ok.json"), "--out-dir",
               str(tmp_path / "a-file"))
    assert r.returncode == 2 and "--out-dir" in r.stderr and "is not a folder" in r.stderr, r.stderr
    (tmp_path / "d" / "train_recall_kimi.pdf").mkdir(parents=True)
    r = figure("fig_train_kimi.py", str(tmp_path / "k.h5"), "--dump", str(tmp_path / "ok.json"), "--out-dir",
               str(tmp_path / "d"))
    assert r.returncode == 2 and "train_recall_kimi.pdf is a folder" in r.stderr, r.stderr
    r = figure("fig_train_kimi.py", str(tmp_path / "k.h5"), "--dump", str(tmp_path / "missing" / "ok.json"))
    assert r.returncode == 2 and "--dump" in r.stderr and "does not exist" in r.stderr, r.stderr
    assert not (tmp_path / "ok.json").exists() and os.listdir(tmp_path / "d") == ["train_recall_kimi.pdf"]


def test_figure_from_the_data_folder_notes_every_file_and_skips_an_empty_one(tmp_path):
    synthetic_results(tmp_path / "a.h5", "kimi-reduced", KIMI_ROWS)  # 16 runs of a reduced grid
    synthetic_results(tmp_path / "b.h5", "kimi", KIMI_ROWS[:8])      # 8 runs of the full grid
    synthetic_results(tmp_path / "c.h5", "kimi-reduced", [])         # a family file with no rows
    r = figure_in(tmp_path, "fig_train_kimi.py", "--dump", str(tmp_path / "k.json"))
    assert r.returncode == 0, r.stderr
    import json
    dump = json.loads((tmp_path / "k.json").read_text())
    assert "reduced grid: 16 runs (and 1 file(s) of a full grid)" in dump["suptitle"], dump["suptitle"]
    footer = " ".join(t["text"] if isinstance(t, dict) else str(t) for t in dump.get("texts", []))
    assert str(tmp_path / "a.h5") in footer and str(tmp_path / "b.h5") in footer  # outside the repository: as given
    assert f"and {tmp_path / 'b.h5'}: kdalab" in footer  # each further file's own provenance, not only the first's


@pytest.mark.parametrize("bad,says", [("text", "test_accuracy is not numeric"), ("2d", "are not 1-D")])
def test_figure_refuses_damaged_accuracy_columns_in_one_line(tmp_path, bad, says):
    synthetic_results(tmp_path / "k.h5", "kimi-reduced", KIMI_ROWS)
    damage = {"text": "t['test_accuracy'] = np.array([b'x'] * 16)",
              "2d": "t['test_accuracy'] = np.full((16, 2), 0.5)"}[bad]
    code = ("import h5py, numpy as np, sys\nf = h5py.File(sys.argv[1], 'r+')\nt = f['train_recall']\n"
            "del t['test_accuracy']\n" + damage + "\nf.close()")
    figure("fig_train_kimi.py", "--help")  # skips the test when /usr/bin/python3 lacks h5py, which damages the file
    subprocess.run(["/usr/bin/python3", "-c", code, str(tmp_path / "k.h5")], check=True)
    r = figure("fig_train_kimi.py", str(tmp_path / "k.h5"), "--dump", str(tmp_path / "k.json"))
    assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "k.json").exists()


@pytest.mark.parametrize("script,column,damage,says", [
    ("fig_train_kimi.py", "d_model", "np.full(16, np.nan)", "train_recall d_model holds 16 value(s) that are not"),
    ("fig_train_kimi.py", "seq_len", "np.full(16, np.nan)", "train_recall seq_len holds 16 value(s) that are not"),
    ("fig_train_kimi.py", "seq_len", "np.array([0.0] * 8 + [256.0] * 8)", "seq_len holds 8 value(s) that are not"),
    ("fig_train_kimi.py", "d_model", "np.array([b'x'] * 16)", "train_recall d_model is not numeric"),
    ("fig_train_kimi.py", "mixer", "np.arange(16)", "train_recall mixer is not text"),
    ("fig_train_zoology.py", "kv_pairs", "np.array([np.nan] + [4.0] * 15)", "kv_pairs holds 1 value(s) that are not"),
    ("fig_train_zoology.py", "d_model", "np.array([np.nan] + [64.0] * 15)", "d_model holds 1 value(s) that are not"),
    ("fig_train_zoology.py", "seq_len", "np.array([b'x'] * 16)", "train_recall seq_len is not numeric"),
    ("fig_train_zoology.py", "task", "np.arange(16)", "train_recall task is not text"),
])
def test_figures_refuse_damaged_shape_columns_in_one_line(tmp_path, script, column, damage, says):
    rows = KIMI_ROWS if "kimi" in script else [("mqar", 64, 4, d, m, lr, 0.5) for d in (64, 128)
                                                 for m in ("kda", "softmax") for lr in (1e-3, 1e-2, 3e-3, 3e-2)]
    synthetic_results(tmp_path / "k.h5", "kimi-reduced" if "kimi" in script else "zoology-reduced", rows)
    code = ("import h5py, numpy as np, sys\nf = h5py.File(sys.argv[1], 'r+')\nt = f['train_recall']\n"
            f"del t['{column}']\nt['{column}'] = {damage}\nf.close()")
    figure(script, "--help")  # skips the test when /usr/bin/python3 lacks h5py, which damages the file
    subprocess.run(["/usr/bin/python3", "-c", code, str(tmp_path / "k.h5")], check=True)
    r = figure(script, str(tmp_path / "k.h5"), "--dump", str(tmp_path / "k.json"), "--out-dir", str(tmp_path / "fig"))
    assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "k.json").exists() and not (tmp_path / "fig").exists()


def test_a_training_batch_without_a_scored_position_is_not_a_divergence(tmp_path, capsys):
    """Short Stack sequences pop rarely: with one example a batch, most batches score nothing and have no loss
    (NaN in the curves). The final loss and accuracy are the last scored batch's, and the run is not called
    diverged for an unscored last batch."""
    pytest.importorskip("torch")
    out = tmp_path / "s.h5"
    argv = ["--device", "cpu", "--tasks", "stack", "--seq-len", "8", "--vocab", "200", "--d-model", "8",
            "--train-examples", "32", "--test-examples", "64", "--batch-size", "1", "--epochs", "1", "--quiet",
            "--out", str(out)]
    assert tr.main(argv) == 0
    text = capsys.readouterr().out
    loss = kdalab.read_array(str(out), "train_recall/runs/000/loss")
    assert np.isnan(loss[-1]) and np.isfinite(loss).any()  # the last batch of this split scores nothing
    assert "diverged" not in text, text
    last = loss[np.isfinite(loss)][-1]
    assert kdalab.read_array(str(out), "train_recall/final_loss")[0] == pytest.approx(last)
    assert np.isfinite(kdalab.read_array(str(out), "train_recall/final_train_accuracy")[0])
