"""The metrics and verdict of `kdalab check` (numerics/metrics.hpp), the budgets
(numerics/tolerance.hpp) and the HDF5 results writer (experiments/results.hpp) from Python."""
import os
import subprocess

import numpy as np
import pytest

import kdalab


def test_metrics_of_a_known_error():
    truth = np.array([3.0, 4.0])
    c = kdalab.check(np.array([3.0, 4.5]), truth, name="o", tol=0.2)
    assert c.rel_rms == pytest.approx(0.1, rel=1e-15) and c.max_abs == 0.5 and c.n == 2
    assert c.passed and c.verdict == "o 1.000e-01 <= 2.0e-01"
    assert c.max_ulp_bf16 == 16  # bf16 spacing in [4, 8) is 2^-5: 4.5 - 4 = 16 units


def test_nan_and_inf_fail_with_infinite_error():
    c = kdalab.check(np.array([np.nan, np.inf, 1.0]), np.ones(3), name="o")
    assert (c.nan_count, c.inf_count) == (1, 1) and c.rel_rms == np.inf and not c.passed
    assert c.max_ulp_bf16 == np.iinfo(np.int64).max


def test_an_all_zero_truth_passes_only_an_exact_zero():
    c = kdalab.check(np.full(3, 1e-3), np.zeros(3), name="dw")
    assert c.rel_rms == np.inf and not c.passed, c
    assert kdalab.check(np.zeros(3), np.zeros(3), name="dw").passed


def test_default_budget_is_check_default():
    value, why = kdalab.budgets()["check_default"]
    assert kdalab.CHECK_DEFAULT_TOL == value == 5.0e-3 and why
    assert kdalab.check(np.ones(3), np.ones(3)).tol == value


def test_float32_candidate_is_read_exactly():
    x = np.array([1.0 + 2.0**-20], dtype=np.float32)
    assert kdalab.check(x, np.array([1.0])).max_abs == 2.0**-20


def test_results_file_has_the_command_line_schema(tmp_path):
    out = str(tmp_path / "r.h5")
    with kdalab.ResultsFile(out, command_line="python demo", config='{"x": 1}', seed="7") as f:
        f.group("demo", "a demo group")
        f.write_array("demo", "a", np.arange(6.0).reshape(2, 3), units="1", description="an array",
                      attrs={"layout": "KV"})
        f.write_table("demo/table", [("n", "1", "count", [1, 2]), ("err", "1", "error", [0.5, 0.25]),
                                     ("name", "1", "label", ["x", "y"])])
        f.attr("demo", "note", "text")
        assert not os.path.exists(out)  # written to a temporary name until commit
    for a in ["software", "software_version", "git_sha", "date", "command_line", "config", "host", "device", "seed"]:
        assert kdalab.read_attr(out, "/", a) != "" or a == "seed", a
    assert kdalab.read_attr(out, "/", "software") == "kdalab"
    assert kdalab.read_attr(out, "/", "command_line") == "python demo"
    assert np.array_equal(kdalab.read_array(out, "demo/a"), np.arange(6.0).reshape(2, 3))
    assert kdalab.read_attr(out, "demo/a", "units") == "1"
    assert list(kdalab.read_array(out, "demo/table/err")) == [0.5, 0.25]
    assert sorted(kdalab.members(out, "demo/table")) == ["err", "n", "name"]


def test_reading_a_path_hdf5_cannot_follow_raises_error_naming_it(tmp_path):
    # a path through a dataset, an empty name, a dataset read as a group: HDF5's own failure escaped as a SystemError
    out = str(tmp_path / "r.h5")
    with kdalab.ResultsFile(out) as f:
        f.write_array("demo", "a", np.arange(3.0), units="1", description="an array")
    for read, path in [(kdalab.read_array, "demo/a/x"), (kdalab.read_array, ""), (kdalab.members, "demo/a"),
                       (kdalab.exists, "demo/a/x")]:
        with pytest.raises(kdalab.Error, match=f"file '{out}': cannot read '{path}'"):
            read(out, path)
    with pytest.raises(kdalab.Error, match="cannot read 'demo/a/x'"):
        kdalab.read_attr(out, "demo/a/x", "units")


def test_results_file_never_overwrites_without_force_and_leaves_nothing_on_failure(tmp_path):
    out = str(tmp_path / "r.h5")
    with pytest.raises(RuntimeError):
        with kdalab.ResultsFile(out) as f:
            f.group("g", "d")
            raise RuntimeError("the run failed")
    del f
    assert not os.path.exists(out) and os.listdir(tmp_path) == []
    with kdalab.ResultsFile(out):
        pass
    with pytest.raises(kdalab.Error, match="exists"):
        kdalab.ResultsFile(out)
    kdalab.ResultsFile(out, force=True).commit()


def _refused_and_nothing_written(tmp_path, write, says):
    """write(f) on a ResultsFile in tmp_path raises kdalab.Error matching says, and no file is left there."""
    with pytest.raises(kdalab.Error, match=says):
        with kdalab.ResultsFile(str(tmp_path / "r.h5")) as f:
            write(f)
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize("write, says", [
    (lambda f: f.write_array("g", "x\0y", np.ones(2), units="1", description="d"), r"array name 'x\\0y' of 'g'"),
    (lambda f: f.write_table("t", [("a/b", "1", "d", [1.0])]), r"table column name 'a/b' of 't'"),
    (lambda f: f.group("../x", "d"), r"group '\.\./x' has a part '\.\.'"),
    (lambda f: f.attr("/", "a", "v\0w"), r"attribute 'a' of '/' holds a NUL character"),
])
def test_results_file_refuses_names_hdf5_would_cut_or_read_as_paths_and_writes_nothing(tmp_path, write, says):
    _refused_and_nothing_written(tmp_path, write, says)


def test_results_file_table_int_columns_hold_every_int64_exactly(tmp_path):
    out = str(tmp_path / "r.h5")
    ints = [2**53 + 1, 2**63 - 1, -2**63, 7]
    with kdalab.ResultsFile(out) as f:
        f.write_table("t", [("n", "1", "count", ints)])
    assert list(kdalab.read_array(out, "t/n")) == [float(x) for x in ints]  # 2^63 - 1 read as 2^63, not -2^63
    py = "/usr/bin/python3"  # the exact int64 values, through h5py (the figures' interpreter), where it has it
    if os.path.exists(py) and subprocess.run([py, "-c", "import h5py"]).returncode == 0:
        r = subprocess.run([py, "-c", "import h5py, sys; d = h5py.File(sys.argv[1], 'r')['t/n']; "
                                      "print(d.dtype, d[()].tolist())", out], capture_output=True, text=True)
        assert r.stdout.strip() == f"int64 {ints}", r.stderr


@pytest.mark.parametrize("values, says", [
    ([2**63], r"column 'c' value 0 = 9223372036854775808 \(int\); accepted: an int in \[-2\^63, 2\^63 - 1\]"),
    ([1, 2.5], r"column 'c' value 1 = 2\.5 \(float\); accepted: an int"),
    (["a", 1], r"column 'c' value 1 = 1 \(int\); accepted: a str"),
    ([1.0, None], r"column 'c' value 1 = None \(NoneType\); accepted: a float"),
    ([1.0, "x"], r"column 'c' value 1 = 'x' \(str\); accepted: a float"),
    ("abc", r"the values of column 'c' are 'abc' \(str\); accepted: a list"),
    (3.0, r"the values of column 'c' are 3\.0 \(float\); accepted: a list"),
])
def test_results_file_table_values_of_another_kind_raise_error_naming_the_column(tmp_path, values, says):
    _refused_and_nothing_written(tmp_path, lambda f: f.write_table("t", [("c", "1", "d", values)]), says)


@pytest.mark.parametrize("write, says", [
    (lambda f: f.write_table("t", [("a", "1", "d", [1.0]), ("a", "1", "d", [2.0])]),
     r"table column 'a' of 't' is given twice"),
    (lambda f: f.write_table("t", [["a", "1", "d", [1.0]]]), r"column 0 must be \(name, units, description, values\)"),
    (lambda f: f.write_table("t", [(1, "1", "d", [1.0])]), r"column 0's name = 1 \(int\); accepted: a str"),
    (lambda f: (f.write_array("g", "x", np.ones(2), units="1", description="d"), f.group("g/x", "d")),
     r"'g/x' is an array, not a group"),
    (lambda f: (f.write_array("g", "x", np.ones(2), units="1", description="d"),
                f.write_array("g/x", "y", np.ones(2), units="1", description="d")), r"'g/x' is an array, not a group"),
    (lambda f: (f.write_array("g", "x", np.ones(2), units="1", description="d"), f.attr("g/x/y", "a", "v")),
     r"'g/x' is an array, not a group"),
    (lambda f: (f.write_array("g", "x", np.ones(2), units="1", description="d"), f.attr("g/x/y", "a", 1.0)),
     r"'g/x' is an array, not a group"),
])
def test_results_file_tables_and_paths_it_cannot_write_raise_error_and_write_nothing(tmp_path, write, says):
    _refused_and_nothing_written(tmp_path, write, says)


def test_results_file_numeric_attribute_on_a_new_path_makes_the_group_as_a_text_one_does(tmp_path):
    out = str(tmp_path / "r.h5")
    with kdalab.ResultsFile(out) as f:
        f.attr("a/b", "n", 2.5)
        f.attr("c/d", "s", "text")
    assert kdalab.read_attr(out, "a/b", "n") == 2.5
    assert kdalab.read_attr(out, "c/d", "s") == "text"


def test_results_file_calls_after_commit_raise_error_naming_the_file(tmp_path):
    out = str(tmp_path / "r.h5")
    f = kdalab.ResultsFile(out)
    f.commit()
    for call in (lambda: f.group("g", "d"), lambda: f.write_array("g", "x", np.ones(1), units="1", description="d"),
                 lambda: f.write_table("g", [("c", "1", "d", [1.0])]), lambda: f.attr("/", "a", "v"),
                 lambda: f.attr("/", "a", 1.0), f.commit):
        with pytest.raises(kdalab.Error, match=f"results file '{out}': commit\\(\\) was called"):
            call()
    assert os.listdir(tmp_path) == ["r.h5"]
    # a commit whose write fails closes the file too: a second commit is the same Error, not HDF5's
    gone = tmp_path / "gone"
    gone.mkdir()
    g = kdalab.ResultsFile(str(gone / "x.h5"))
    gone.rmdir()
    with pytest.raises(RuntimeError, match="nothing was written"):
        g.commit()
    with pytest.raises(kdalab.Error, match="commit\\(\\) was called"):
        g.commit()


def test_cuda_entry_points_say_what_is_missing():
    if kdalab.built_with_cuda:
        pytest.skip("built with CUDA")
    with pytest.raises(kdalab.NotAvailable, match="built without its CUDA kernels"):
        kdalab.require_cuda()
