"""`kdalab verify` from the command line: bad options, the report (root attributes, reproducers), replay."""
import os
import subprocess
import sys

import pytest

import kdalab
from kdalab.verify import replay, run
from kdalab.verify.cli import main


def verify(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "kdalab.verify", *args], capture_output=True, text=True, cwd=cwd)


def test_help_lists_every_option():
    p = verify("--help")
    assert p.returncode == 0
    for opt in ("--op", "--candidate", "--adapter", "--cases", "--long", "--param", "--truth", "--out", "--replay",
                "--case", "--list", "--quiet", "--no-report"):
        assert opt in p.stdout, opt


@pytest.mark.parametrize("args, names", [
    (["--bogus"], "--bogus"),
    (["--op", "softmax"], "--op"),
    (["--adapter", "nope"], "nope"),
    (["--adapter", ""], "--adapter ''"),
    (["--adapter", "canonical:precision=fp8"], "fp8"),
    (["--candidate", "nomodule_xyz:f"], "nomodule_xyz"),
    (["--candidate", "no-colon"], "MODULE:FUNCTION"),
    (["--cases", "no/such/*"], "no/such"),
    (["--param", "d_k"], "KEY=VALUE"),
    (["--replay", "r.h5"], "--case"),
    (["--cases", ","], "--cases"),
    (["--cases", ""], "--cases"),
    (["--param", "d_k=abc"], "d_k"),
    (["--param", "T=1e3"], "T"),
    (["--param", "T=null"], "T"),
    (["--op", "mla_decode", "--param", "lens=3"], "(e.g. lens=[16,9])"),
    (["--param", "eps=true"], "(e.g. eps=0.5)"),
    (["--param", "no_such_param=1"], "no_such_param"),
    (["--cases", "agree/T17", "--param", "log2_norm=2"], "log2_norm"),
    (["--no-report"], "--no-report"),
    (["--replay", "r.h5", "--case", "agree/T17"], "--out has no effect with --replay"),
    (["--replay", "r.h5", "--case", "agree/T17", "--cases", "agree/*"], "--cases has no effect with --replay"),
])
def test_bad_option_is_one_line_exit_2_and_writes_nothing(tmp_path, args, names):
    p = verify(*args, "--out", str(tmp_path / "r.h5"), cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and names in lines[0] and lines[0].startswith("kdalab-verify: error:"), p.stderr
    assert os.listdir(tmp_path) == []


def test_out_in_a_missing_folder_is_refused_and_nothing_is_made(tmp_path):
    p = verify("--cases", "agree/T1", "--out", str(tmp_path / "no" / "r.h5"))
    assert p.returncode == 2 and "--out" in p.stderr and "folder does not exist" in p.stderr, p.stderr
    assert os.listdir(tmp_path) == []


def test_default_report_folder_results_is_made_when_missing(tmp_path):
    p = verify("--cases", "agree/T1", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "results" / "verify-kda.h5").is_file()


def test_existing_report_is_never_overwritten(tmp_path):
    out = tmp_path / "r.h5"
    out.write_bytes(b"keep")
    p = verify("--cases", "agree/T17", "--out", str(out))
    assert p.returncode == 2 and "exists" in p.stderr
    assert out.read_bytes() == b"keep"


def test_one_line_per_case_and_a_summary(tmp_path):
    p = verify("--cases", "agree/T17,causal/T17-P5", "--no-report", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].split()[:3] == ["ok", "agree/T17", "agreement"]
    assert lines[1].split()[:3] == ["ok", "causal/T17-P5", "causality"]
    assert any(l.startswith("property") for l in lines) and lines[-1].split()[:2] == ["total", "2"]
    assert os.listdir(tmp_path) == []


def leaky(q, k, v, g, beta, *, scale, initial_state=None, cu_seqlens=None):
    """A candidate whose output at t reads the value at t + 1."""
    from kdalab.verify.candidates import numpy_kda
    o, S = numpy_kda(q, k, v, g, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens)
    o[:, :-1] += 1e-6 * v[:, 1:]
    return o, S


def test_report_holds_root_attributes_and_every_failures_reproducer(tmp_path):
    out = str(tmp_path / "r.h5")
    rep = run(leaky, "kda", ["causal/T17-P5", "agree/T16"], out=out, command_line="kdalab-verify test",
              printer=None)
    assert rep.exit_code() == 1
    for a in ("software", "software_version", "git_sha", "date", "command_line", "config", "host", "seed"):
        assert kdalab.read_attr(out, "/", a) is not None, a
    assert kdalab.read_attr(out, "/", "command_line") == "kdalab-verify test"
    assert kdalab.members(out, "verify/failures") == ["000", "001"]  # catalogue order: agree/T16 first
    g = "verify/failures/001"
    assert kdalab.read_attr(out, g, "case") == "causal/T17-P5"
    assert kdalab.read_attr(out, g, "property") == "causality"
    assert kdalab.read_attr(out, g, "verdict") == "property broken"
    assert kdalab.read_attr(out, g, "seed") == 62.0
    assert kdalab.read_attr(out, g, "generator_call") == "random_kda(seed=62, T=17)"
    assert "q [1, 17, 2, 16]" in kdalab.read_attr(out, g, "shapes")
    assert list(kdalab.read_array(out, "verify/cases/passed")) == [0.0, 0.0]


def test_replay_reruns_a_failure_exactly(tmp_path):
    out = str(tmp_path / "r.h5")
    first = run(leaky, "kda", ["causal/T17-P16"], out=out, params={"d_k": 8, "d_v": 8}, printer=None).results[0]
    again = replay(out, "causal/T17-P16", candidate=leaky, printer=None).results[0]
    assert (again.verdict, again.detail) == (first.verdict, first.detail)
    assert again.verdict == "property broken"


def test_replay_from_the_command_line_uses_the_recorded_candidate(tmp_path, capsys):
    out = str(tmp_path / "r.h5")
    assert main(["--cases", "agree/T65", "--out", out, "--quiet"]) == 0
    assert main(["--replay", out, "--case", "agree/T65"]) == 0
    assert "ok     agree/T65" in capsys.readouterr().out
    assert main(["--replay", out, "--case", "agree/T1"]) == 2


@pytest.mark.parametrize("path, says", [
    (".", "is a directory"),
    ("/dev/null", "is not a regular file"),
    ("", "--replay ''"),
    ("no-such-report.h5", "no such file"),
])
def test_replay_of_a_path_that_is_not_a_report_file_says_what_it_is(tmp_path, capsys, path, says):
    assert main(["--replay", str(tmp_path) if path == "." else path, "--case", "agree/T1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kdalab-verify: error: --replay") and says in err[0], err


def test_an_empty_adapter_is_refused_never_the_default(tmp_path, capsys):
    """An empty --adapter is a bad adapter string like ':' (the run's and the replay's), not the default one."""
    out = str(tmp_path / "r.h5")
    assert main(["--cases", "agree/T1", "--out", out, "--quiet"]) == 0
    capsys.readouterr()
    for argv in (["--cases", "agree/T1", "--no-report", "--adapter", ""],
                 ["--replay", out, "--case", "agree/T1", "--adapter", ""]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--adapter ''" in err[0] and "accepted: canonical" in err[0], err
    with pytest.raises(ValueError, match="--adapter ''"):
        run("kdalab.verify.candidates:numpy_kda", "kda", ["agree/T1"], adapter="", printer=None)


@pytest.mark.parametrize("config, case_json, says", [
    ("xx", None, "config is not JSON"),
    ("[1, 2]", None, "config is not a verify run's"),
    (None, "{}", "is damaged"),
    (None, "nope", "is damaged"),
    (None, "generator", "names the generator 'nosuch'"),
])
def test_replay_of_a_damaged_report_is_one_line_exit_2(tmp_path, capsys, config, case_json, says):
    import json
    from kdalab.verify.cases import find
    name = "causal/T17-P16"
    good = {"op": "kda", "candidate": "kdalab.verify.candidates:numpy_kda", "adapter": "canonical", "cases": [name]}
    case = json.loads(find(name).to_json())
    case["generator"] = "nosuch"
    out = str(tmp_path / "r.h5")
    with kdalab.ResultsFile(out, command_line="", config=config or json.dumps(good), seed="1") as f:
        f.group("verify", "a damaged report")
        f.group("verify/failures", "failures")
        f.group("verify/failures/000", "one failure")
        f.attr("verify/failures/000", "case", name)
        f.attr("verify/failures/000", "case_json",
               json.dumps(case) if case_json == "generator" else case_json or find(name).to_json())
    assert main(["--replay", out, "--case", name]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kdalab-verify: error: --replay") and says in err[0], err


def test_replay_of_a_failure_whose_generator_now_makes_other_tensors_is_one_line_exit_2(tmp_path, capsys):
    """A report written before adv/long-memory carried beta logits recorded its failure's shapes without beta_raw: the
    same generator call now makes other inputs, so the replay is refused, not run on them."""
    import json
    from kdalab.verify.cases import find
    from kdalab.verify.runner import _shapes
    name = "adv/long-memory"
    case = find(name)
    old_shapes = ", ".join(p for p in _shapes(case).split(", ") if not p.startswith("beta_raw "))
    config = {"op": "kda", "candidate": "kdalab.verify.candidates:numpy_kda", "adapter": "canonical", "cases": [name]}
    for shapes, code in ((old_shapes, 2), (_shapes(case), None)):
        out = str(tmp_path / f"r{code}.h5")
        with kdalab.ResultsFile(out, command_line="", config=json.dumps(config), seed="34") as f:
            f.group("verify", "a report with one failure")
            f.group("verify/failures", "failures")
            f.group("verify/failures/000", "one failure")
            for k, v in (("case", name), ("case_json", case.to_json()), ("shapes", shapes)):
                f.attr("verify/failures/000", k, v)
        if code is None:  # the shapes this kdalab makes: replayed (the numpy candidate is within budget)
            assert main(["--replay", out, "--case", name, "--quiet"]) == 0
            continue
        assert main(["--replay", out, "--case", name]) == code
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"kdalab-verify: error: --replay {out}: case 'adv/long-memory'"), err
        assert "long_memory(seed=34, T=2000) now makes other tensors than the report's" in err[0], err
        assert "now: " in err[0] and "beta_raw [1, 2000, 2]" in err[0].split("now: ")[1], err


def test_replay_of_a_kdalab_cuda_report_in_a_build_without_its_entry_point_is_not_applicable(tmp_path, capsys):
    """The report of kdalab's own kernel records the adapter's entry point as its candidate; replayed where that entry
    point is missing (a CPU build), the case is "not applicable" (exit 4) as in the run, not a bad --candidate."""
    if kdalab.built_with_cuda:
        pytest.skip("this kdalab has its CUDA entry points")
    out = str(tmp_path / "r.h5")
    assert main(["--adapter", "kdalab-cuda:precision=accurate", "--cases", "agree/T1", "--out", out, "--quiet"]) == 4
    assert kdalab.read_attr(out, "verify", "candidate") == "kdalab._core:cuda_kda_prefill"
    capsys.readouterr()
    assert main(["--replay", out, "--case", "agree/T1"]) == 4
    captured = capsys.readouterr()
    assert "not applicable: this kdalab was built without its CUDA entry points" in captured.out, captured.out
    assert captured.err == ""


@pytest.mark.parametrize("field, recorded, says", [
    ("shapes", "q [2, 17, 2, 16], k [2, 17, 2, 16]", "now makes other tensors than the report's"),
    ("calls", "random_kda(seed=101, B=2, T=33)", "the report ran the generator call random_kda(seed=101, B=2, T=33), "
                                                 "this kdalab's catalogue now makes random_kda(seed=101, B=2, T=1)"),
])
def test_replay_of_a_passed_case_the_catalogue_now_builds_otherwise_is_one_line_exit_2(tmp_path, capsys, field,
                                                                                        recorded, says):
    """A passed case is replayed from the catalogue (it has no reproducer group): a report whose recorded generator
    call or tensors of that case differ from what this kdalab builds is refused, as a failure's reproducer is."""
    import json
    src = str(tmp_path / "src.h5")
    assert main(["--cases", "agree/T1", "--out", src, "--quiet"]) == 0
    config = json.loads(kdalab.read_attr(src, "/", "config"))
    assert config["calls"] == {"agree/T1": "random_kda(seed=101, B=2, T=1)"}
    assert config["shapes"]["agree/T1"].startswith("q [2, 1, 2, 16], k [2, 1, 2, 16]")
    assert main(["--replay", src, "--case", "agree/T1", "--quiet"]) == 0  # as recorded: replayed
    capsys.readouterr()
    config[field]["agree/T1"] = recorded
    out = str(tmp_path / "r.h5")
    with kdalab.ResultsFile(out, command_line="", config=json.dumps(config), seed="1") as f:
        f.group("verify", "a report without failures")
        f.group("verify/failures", "failures")
    assert main(["--replay", out, "--case", "agree/T1"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"kdalab-verify: error: --replay {out}: case 'agree/T1'"), err
    assert says in err[0] and "--cases agree/T1" in err[0], err
    assert "agree/T1" not in captured.out  # nothing was run


@pytest.mark.parametrize("change, name, says", [
    ({"params": "oops"}, "agree/T1", "config is not a verify run's"),
    ({"cases": [1, 2]}, "agree/T1", "config is not a verify run's"),
    ({"adapter": 7}, "agree/T1", "config is not a verify run's"),
    ({"truth": 5}, "agree/T1", "config is not a verify run's"),
    ({"params": {"T": "x"}}, "agree/T1", "its recorded parameters do not fit case 'agree/T1' (--param T=\"x\": T is int"),
    ({"cases": ["nosuch/x"]}, "nosuch/x", "its case 'nosuch/x' is not in kdalab's catalogue of op 'kda'"),
])
def test_replay_of_a_report_with_a_foreign_config_is_one_line_exit_2(tmp_path, capsys, change, name, says):
    import json
    config = {"op": "kda", "candidate": "kdalab.verify.candidates:numpy_kda", "adapter": "canonical",
              "cases": ["agree/T1"], **change}
    out = str(tmp_path / "r.h5")
    with kdalab.ResultsFile(out, command_line="", config=json.dumps(config), seed="1") as f:
        f.group("verify", "a report without failures")
        f.group("verify/failures", "failures")
    assert main(["--replay", out, "--case", name]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"kdalab-verify: error: --replay {out}") and says in err[0], err


def test_a_param_is_accepted_only_when_the_generator_it_reaches_takes_it(tmp_path):
    # short_sequences passes its parameters to varlen, which takes no T (offered T, the generator would raise)
    p = verify("--cases", "adv/varlen-hundreds", "--param", "T=5", "--no-report", cwd=tmp_path)
    assert p.returncode == 2 and "--param T=5: no selected case's generator takes 'T'; accepted: H, HV, d_k, d_v, " \
        "max_len, n, state" in p.stderr, p.stderr
    p = verify("--cases", "adv/varlen-hundreds", "--param", "d_k=8", "--no-report", "--quiet", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr


def test_a_param_given_twice_is_one_line_exit_2(tmp_path):
    p = verify("--cases", "agree/T1", "--param", "d_k=8", "--param", "d_k=16", "--no-report", cwd=tmp_path)
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(err) == 1 and "--param d_k is given twice; give each key once" in err[0], p.stderr


def test_a_case_too_large_for_memory_is_not_applicable_never_a_traceback(tmp_path):
    p = verify("--cases", "agree/T1", "--param", f"T={10**12}", "--no-report", cwd=tmp_path)
    assert p.returncode == 4 and "Traceback" not in p.stderr, p.stdout + p.stderr
    assert "n/a    agree/T1" in p.stdout and "the case's inputs do not fit in memory" in p.stdout


def test_long_cases_are_skipped_unless_asked(tmp_path):
    names = [c.name for c in kdalab.verify.catalogue("kda")]
    assert "agree/T1000" not in names and "agree/T65536" not in names and "adv/long-memory" not in names
    long_names = [c.name for c in kdalab.verify.catalogue("kda", long=True)]
    assert {"agree/T1000", "agree/T65536", "adv/long-memory"} <= set(long_names)


def test_everything_not_applicable_is_exit_4_never_a_pass(tmp_path):
    p = verify("--adapter", "flashkda", "--candidate", "kdalab.verify.candidates:numpy_kda", "--cases", "agree/*",
               "--no-report", cwd=tmp_path)
    assert p.returncode == 4, p.stdout + p.stderr
    assert "n/a" in p.stdout and "ok " not in p.stdout


CANDIDATES = """
import sys
from kdalab.verify.candidates import numpy_kda
def exits(*a, **k):
    sys.exit(0)
def interrupted(*a, **k):
    raise KeyboardInterrupt
"""


def test_a_candidate_that_exits_is_broken_never_the_runs_exit_code(tmp_path):
    (tmp_path / "cands_exit.py").write_text(CANDIDATES)
    p = verify("--candidate", "cands_exit:exits", "--cases", "agree/T17", "--no-report", cwd=tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "property broken" in p.stdout and "SystemExit" in p.stdout


def test_interrupt_and_unwritable_report_are_one_line_without_traceback(tmp_path):
    (tmp_path / "cands_exit.py").write_text(CANDIDATES)
    out = tmp_path / "r.h5"
    p = verify("--candidate", "cands_exit:interrupted", "--cases", "agree/T17", "--out", str(out), cwd=tmp_path)
    assert p.returncode == 130 and not out.exists(), p.stderr
    assert p.stderr.strip().splitlines() == ["kdalab-verify: interrupted; no report was written"], p.stderr
    if os.path.isdir("/proc/self"):  # a folder where no file can be created, for every user
        p = verify("--cases", "agree/T17", "--out", "/proc/kdalab-verify-report.h5", "--quiet", cwd=tmp_path)
        assert p.returncode == 5, p.stderr
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("kdalab-verify: error:") and "nothing was written" in lines[0]
