"""The metrics and verdict of `kdalab check` (numerics/metrics.hpp), the budgets
(numerics/tolerance.hpp) and the HDF5 results writer (experiments/results.hpp) from Python."""
import os

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


@pytest.mark.parametrize("write, says", [
    (lambda f: f.write_array("g", "x\0y", np.ones(2), units="1", description="d"), r"array name 'x\\0y' of 'g'"),
    (lambda f: f.write_table("t", [("a/b", "1", "d", [1.0])]), r"table column name 'a/b' of 't'"),
    (lambda f: f.group("../x", "d"), r"group '\.\./x' has a part '\.\.'"),
    (lambda f: f.attr("/", "a", "v\0w"), r"attribute 'a' of '/' holds a NUL character"),
])
def test_results_file_refuses_names_hdf5_would_cut_or_read_as_paths_and_writes_nothing(tmp_path, write, says):
    out = str(tmp_path / "r.h5")
    with pytest.raises(kdalab.Error, match=says):
        with kdalab.ResultsFile(out) as f:
            write(f)
    assert not os.listdir(tmp_path)


def test_cuda_entry_points_say_what_is_missing():
    if kdalab.built_with_cuda:
        pytest.skip("built with CUDA")
    with pytest.raises(kdalab.NotAvailable, match="built without its CUDA kernels"):
        kdalab.require_cuda()
