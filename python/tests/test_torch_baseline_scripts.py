"""The torch baseline scripts of bench/ (torch_mla_prefill.py, torch_mla_decode.py, through bench/torch_baseline.py)
follow kdalab's rules where no GPU is needed: bad arguments give one line and exit 2 with nothing written, an
existing output is never touched without --force, and a machine without torch or without a CUDA device gets one
line and exit 3."""
import os
import subprocess
import sys

import pytest

from conftest import ROOT

PREFILL = str(ROOT / "bench" / "torch_mla_prefill.py")
DECODE = str(ROOT / "bench" / "torch_mla_decode.py")


def run(script, *args, cwd):
    return subprocess.run([sys.executable, script, *args], capture_output=True, text=True, cwd=cwd)


def has_cuda_torch():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


BAD = [
    (["o.json", "1:2:x"], "shape '1:2:x'; accepted"),
    (["o.json", "0:64:2"], "shape '0:64:2'; accepted"),
    (["o.json", "1:64:300"], "shape '1:64:300'; accepted"),
    (["o.json", "1:64"], "shape '1:64'; accepted"),
    (["o.json", "1:99999999999999999999:2"], "each <= 2147483647"),
    (["o.json", "1:2_048:32"], "shape '1:2_048:32'; accepted"),
    (["o.json", "\u0661:2:3"], "accepted: B:"),
    (["o.json", " 1:64:2"], "shape ' 1:64:2'; accepted"),
    (["o.json", "1:+64:2"], "shape '1:+64:2'; accepted"),
    (["missing/o.json"], "folder 'missing' does not exist"),
    ([""], "OUT.json is empty"),
    (["."], "'.' is a folder"),
    ([], "the following arguments are required: OUT.json"),
]


@pytest.mark.parametrize("script", [PREFILL, DECODE])
@pytest.mark.parametrize("args,says", BAD)
def test_scripts_bad_arguments_one_line_exit_2_nothing_written(tmp_path, script, args, says):
    r = run(script, *args, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert sorted(os.listdir(tmp_path)) == []


@pytest.mark.parametrize("args,says", [
    (["o.json", "--prefix", "-1"], "--prefix -1; accepted: 0 <= N0"),
    (["o.json", "--prefix", "2147483647"], "--prefix 2147483647; accepted"),
    (["o.json", "--accuracy", "o.json"], "--accuracy 'o.json' is OUT.json too"),
    (["o.json", "--accuracy", ""], "--accuracy is empty"),
    (["o.json", "--sustained", "-1"], "--sustained -1.0; accepted: 0 <= SECONDS <= 600"),
    (["o.json", "--sustained", "nan"], "--sustained nan; accepted: 0 <= SECONDS <= 600"),
    (["o.json", "--sustained", "601"], "--sustained 601.0; accepted: 0 <= SECONDS <= 600"),
    (["o.json", "--sustained", "x"], "--sustained: invalid float value: 'x'"),
])
def test_prefill_script_bad_options_one_line_exit_2_nothing_written(tmp_path, args, says):
    r = run(PREFILL, *args, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert sorted(os.listdir(tmp_path)) == []


@pytest.mark.parametrize("args,says", [
    (["o.json", "1:64:2+-5"], "shape '1:64:2+-5'; accepted: B:T:H[+N0]"),
    (["o.json", "1:64:2+"], "shape '1:64:2+'; accepted: B:T:H[+N0]"),
    (["o.json", "1:64:2+16x"], "shape '1:64:2+16x'; accepted"),
    (["o.json", "1:64:2+2147483584"], "N0 + T <= 2147483647"),
    (["o.json", "1:64:2+" + "9" * 5000], "; accepted: B:T:H[+N0]"),  # past Python's 4300-digit int() limit
    (["o.json", "1:64:2", "1:64:2+0"], "shape 1:64:2+0 is given more than once"),
    (["o.json", "1:64:2+16", "1:64:2", "--prefix", "16"], "shape 1:64:2+16 is given more than once"),
    (["o.json", "1:64:2+16", "1:64:2", "--prefix", "2147483584"], "--prefix 2147483584; accepted"),
])
def test_prefill_script_bad_prefixed_shapes_one_line_exit_2_nothing_written(tmp_path, args, says):
    r = run(PREFILL, *args, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert sorted(os.listdir(tmp_path)) == []


@pytest.mark.skipif(has_cuda_torch(), reason="torch sees a CUDA device here: the script would run")
@pytest.mark.parametrize("args", [["1:64:2+16"], ["1:64:2+16", "--prefix", "2147483647"], ["--prefix", "32768"],
                                  ["1:64:2+2147483583"]])
def test_prefill_script_prefixed_shapes_accepted(tmp_path, args):
    # a shape's own +N0 wins over --prefix, which no shape then takes; with the defaults, --prefix 32768 makes
    # 1:2048:32 the default 1:2048:32+32768 row (timed once): past the checks, the import of torch (exit 3 here)
    r = run(PREFILL, "o.json", *args, cwd=tmp_path)
    assert r.returncode == 3 and "cannot run here" in r.stderr, r.stderr


def test_prefill_script_an_output_linked_to_the_other_is_one_file(tmp_path):
    os.symlink(tmp_path / "o.json", tmp_path / "alias.json")  # dangling: neither exists yet
    r = run(PREFILL, "o.json", "--accuracy", "alias.json", "--force", cwd=tmp_path)
    assert r.returncode == 2 and "is OUT.json too" in r.stderr, r.stderr


@pytest.mark.parametrize("script", [PREFILL, DECODE])
def test_scripts_never_touch_an_existing_output_without_force(tmp_path, script):
    for name in ("o.json", "acc.json"):
        (tmp_path / name).write_text("keep")
    r = run(script, "o.json", cwd=tmp_path)
    assert r.returncode == 2 and "OUT.json 'o.json' exists; use --force" in r.stderr
    if script == DECODE:
        return
    r = run(PREFILL, "new.json", "--accuracy", "acc.json", cwd=tmp_path)
    assert r.returncode == 2 and "--accuracy 'acc.json' exists; use --force" in r.stderr
    assert (tmp_path / "o.json").read_text() == "keep" and (tmp_path / "acc.json").read_text() == "keep"
    assert sorted(os.listdir(tmp_path)) == ["acc.json", "o.json"]


@pytest.mark.skipif(has_cuda_torch(), reason="torch sees a CUDA device here: the scripts would run")
@pytest.mark.parametrize("script", [PREFILL, DECODE])
def test_scripts_without_torch_or_cuda_say_so_in_one_line_exit_3(tmp_path, script):
    r = run(script, "o.json", cwd=tmp_path)
    assert r.returncode == 3, r.stderr
    assert "cannot run here" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "o.json").exists()
