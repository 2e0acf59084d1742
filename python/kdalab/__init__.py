"""kdalab from Python: the C++ core of kdalab (module kdalab._core) with no math in Python.

Arrays go in through DLPack or the buffer protocol: numpy arrays and torch tensors (CPU), float64,
C-contiguous; outputs are numpy float64 arrays. Bad input raises kdalab.Error (a ValueError) with
the C++ message, which names the tensor or option, the value and what is accepted. Shapes,
layouts and dtypes of every function: kdalab/_core.pyi.
"""
# A build with -DKDALAB_PYTHON=ON puts kdalab._core in <build>/python/kdalab/, apart from these
# files: with both python/ and <build>/python on sys.path, that folder joins the package.
from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)

from ._core import (
    BUDGET_FACTOR,
    BUDGET_FLOOR,
    CHECK_DEFAULT_TOL,
    Budget,
    CheckResult,
    Error,
    IGNORE_INDEX,
    ResultsFile,
    Rng,
    anchor_kda,
    attn_res,
    attn_res_backward,
    budget_kda,
    budget_mla,
    budget_of,
    budgets,
    built_with_cuda,
    cell_seed,
    check,
    exists,
    fnv1a64,
    gate,
    gate_backward,
    kda_chunked,
    kda_chunked_backward,
    kda_decode,
    kda_inputs,
    kda_layer,
    kda_recurrent,
    kda_recurrent_backward,
    members,
    mla,
    mla_attend,
    mla_attend_backward,
    mqar,
    palindrome,
    read_array,
    read_attr,
    software_version,
    stack_task,
)

__version__ = software_version


class NotAvailable(RuntimeError):
    """The work cannot run in this build or on this machine (the command line's exit code 3)."""


def require_cuda() -> None:
    """Raises NotAvailable unless this kdalab was built with its CUDA kernels (KDALAB_CUDA)."""
    if not built_with_cuda:
        raise NotAvailable(
            "kdalab was built without its CUDA kernels: the module kdalab._core has no CUDA entry points; "
            "build kdalab with KDALAB_CUDA=ON (nvcc, sm_90a) to run them on torch CUDA tensors"
        )


__all__ = [
    "BUDGET_FACTOR", "BUDGET_FLOOR", "Budget", "CHECK_DEFAULT_TOL", "CheckResult", "Error", "IGNORE_INDEX", "NotAvailable", "ResultsFile", "Rng", "anchor_kda", "attn_res",
    "attn_res_backward", "budget_kda", "budget_mla", "budget_of", "budgets", "built_with_cuda", "cell_seed",
    "check", "exists", "fnv1a64", "gate",
    "gate_backward", "kda_chunked", "kda_chunked_backward", "kda_decode", "kda_inputs", "kda_layer",
    "kda_recurrent", "kda_recurrent_backward", "members", "mla", "mla_attend", "mla_attend_backward", "mqar", "palindrome",
    "read_array", "read_attr", "require_cuda", "stack_task",
]
from . import verify  # noqa: E402,F401  (kdalab.verify: docs/verify.md)
