"""kdalab from Python: the C++ core of kdalab (module kdalab._core) with no math in Python.

Arrays go in through DLPack or the buffer protocol: numpy arrays and torch tensors (CPU), float64,
C-contiguous; outputs are numpy float64 arrays. Bad input raises kdalab.Error (a ValueError) with
the C++ message, which names the tensor or option, the value and what is accepted (None for a required
array argument: TypeError from the binding layer). Shapes,
layouts and dtypes of every function: kdalab/_core.pyi.
"""
# A build with -DKDALAB_PYTHON=ON puts kdalab._core in <build>/python/kdalab/, apart from these
# files: with both python/ and <build>/python on sys.path, that folder joins the package.
from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)

# A CUDA build of kdalab._core loads the CUDA toolkit's runtime and cuBLAS. torch imported after it aborted in its own
# import ("free(): invalid pointer", seen on an H100 machine with torch 2.x); imported before it, both work. So a CUDA
# build imports torch first when torch is installed (a CPU build never imports it).
try:
    from ._build_config import CUDA as _BUILT_WITH_CUDA
except ImportError:  # a module built before _build_config.py existed
    _BUILT_WITH_CUDA = False
if _BUILT_WITH_CUDA:
    from importlib.util import find_spec as _find_spec

    if _find_spec("torch") is not None:
        import torch  # noqa: F401

from ._core import (
    BUDGET_FACTOR,
    BUDGET_FLOOR,
    CHECK_DEFAULT_TOL,
    Budget,
    CheckResult,
    Error,
    IGNORE_INDEX,
    MAX_TASK_TOKENS,
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
    check_output_path,
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
    "BUDGET_FACTOR", "BUDGET_FLOOR", "Budget", "CHECK_DEFAULT_TOL", "CheckResult", "Error", "IGNORE_INDEX", "MAX_TASK_TOKENS", "NotAvailable", "ResultsFile", "Rng", "anchor_kda", "attn_res",
    "attn_res_backward", "budget_kda", "budget_mla", "budget_of", "budgets", "built_with_cuda", "cell_seed",
    "check", "check_output_path", "exists", "fnv1a64", "gate",
    "gate_backward", "kda_chunked", "kda_chunked_backward", "kda_decode", "kda_inputs", "kda_layer",
    "kda_recurrent", "kda_recurrent_backward", "members", "mla", "mla_attend", "mla_attend_backward", "mqar", "palindrome",
    "read_array", "read_attr", "require_cuda", "stack_task",
]
from . import verify  # noqa: E402,F401  (kdalab.verify: docs/verify.md)
