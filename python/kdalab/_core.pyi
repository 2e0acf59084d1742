"""Type stubs of kdalab._core: shapes, layouts and dtypes of every function, stated once here.

Conventions (docs/design.md): tensors are row-major [B, T, H, D]; array inputs are float64,
C-contiguous and on the CPU (numpy arrays or torch tensors through DLPack; anything else raises
Error naming the tensor); outputs are new numpy float64 arrays. `precision` is "float64" or "mp50"
(boost cpp_bin_float_50, 50 decimal digits: inputs widened exactly, outputs rounded once to float64).
"""
from typing import Any, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

Array = Any  # numpy.ndarray or torch.Tensor (any DLPack / buffer-protocol array)
F64 = npt.NDArray[np.float64]

class Error(ValueError):
    """Bad input: the message names the tensor or option, the value and what is accepted."""

built_with_cuda: bool
software_version: str
CHECK_DEFAULT_TOL: float

def kda_recurrent(q: Array, k: Array, v: Array, g: Array, beta: Array, S0: Optional[Array] = None, *,
                  scale: float, variant: str = "kda", precision: str = "float64") -> Tuple[F64, F64]:
    """KDA recurrence (K3 report Eq. 1; docs/equations.md section 1; reference/kda.hpp kda_recurrent):
    S_t = (I - beta_t k_t k_t^T) Diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T,  o_t = scale S_t^T q_t.

    q, k [B, T, H, d_k]; v [B, T, HV, d_v] (HV a multiple of H: value head j reads key head j / (HV / H));
    g [B, T, HV, d_k] (log-decay, g <= 0); beta [B, T, HV]; S0 [B, HV, d_k, d_v] ("KV" layout) or None
    (zero state); scale > 0 (usually d_k^-1/2). variant: kda, gated_deltanet, deltanet, gla, linear.
    Returns (o [B, T, HV, d_v], S [B, HV, d_k, d_v]). Equals `kdalab check --op kda --truth f64|mp` on
    the same inputs (gate = "none", l2norm_qk = 0) bit for bit."""

def kda_chunked(q: Array, k: Array, v: Array, g: Array, beta: Array, S0: Optional[Array] = None, *,
                scale: float, C: int = 64, tile: int = 16, variant: str = "kda",
                precision: str = "float64") -> Tuple[F64, F64]:
    """Chunked KDA (Kimi Linear sections 3-4; reference/kda_chunk.hpp kda_chunked), equal to kda_recurrent
    up to rounding. Shapes as kda_recurrent; C chunk size >= 1 (T need not be a multiple of C); tile the
    secondary tile of the factored form (0: none). float64 refuses chunks whose factored decay span
    exceeds 700 nats (the error names C and g)."""

def kda_decode(q: Array, k: Array, v: Array, g: Array, beta: Array, S0: Array, *, scale: float,
               precision: str = "float64") -> Tuple[F64, F64]:
    """T one-token decode steps from S0 (K3 report Eq. 1 per token; `kdalab check --op kda-decode`).
    Shapes as kda_recurrent; S0 [B, HV, d_k, d_v] is required."""

def kda_layer(x: Array, weights: Mapping[str, Array], config: Mapping[str, Union[int, float, bool, str]], *,
              precision: str = "float64") -> Tuple[F64, F64, F64]:
    """The KDA layer's prefill on a fresh cache (K3 report Eqs. 2, 5, 6; reference/kda_layer.hpp).

    x [T, hidden]. config: hidden, H, HV, d_k, d_v (required); gate ("bounded" | "softplus"), g_min,
    gate_input ("x" | "v"), gate_rank (0: d_k), conv_kernel (4), l2_eps (1e-6), rms_eps (1e-5),
    scale (0: d_k^-1/2), chunk (64; 0: the recurrence). weights ([out, in], r = gate_rank or d_k,
    K = conv_kernel): W_q, W_k [H d_k, hidden]; W_v [HV d_v, hidden]; conv_q, conv_k [H d_k, K];
    conv_v [HV d_v, K]; W_beta [HV, hidden]; W_a_down [r, hidden]; W_a_up [HV d_k, r];
    W_alpha [HV d_k, HV d_v]; g_bias [HV, d_k]; W_g [HV d_v, hidden]; W_o [hidden, HV d_v];
    A_log [HV]; rms_w [d_v]. Returns (y [T, hidden], o_core [T, HV d_v] (the KDA output before the
    RMSNorm), S [HV, d_k, d_v])."""

def mla(x: Array, weights: Mapping[str, Array], config: Mapping[str, Union[int, float, bool, str]], *,
        eval: str = "naive", precision: str = "float64") -> F64:
    """Gated MLA prefill of one sequence on a fresh latent cache (DeepSeek-V2 Eqs. 9-19, K3 report Eq. 7;
    docs/equations.md section 5; reference/mla.hpp mla_prefill). eval: "naive" (reconstruct k^C, v^C)
    or "absorbed" (W_UK folded into the query, attention over the latent cache).

    x [T, hidden]. config: hidden, n_h, d_c, d_nope, d_v (required); d_cq (0: full-rank W_Q), d_rope (0),
    rope (False), rope_theta (10000), output_gate (True). weights ([out, in], d_qk = d_nope + d_rope):
    W_DKV [d_c, hidden]; W_KR [d_rope, hidden]; W_Q [n_h d_qk, hidden] (d_cq = 0) or W_DQ [d_cq, hidden]
    and W_UQ [n_h d_qk, d_cq]; W_UK [n_h d_nope, d_c]; W_UV [n_h d_v, d_c]; W_g [n_h d_v, hidden]
    (output gate only); W_o [hidden, n_h d_v]. Returns y [T, hidden]."""

def attn_res(v: Array, w: Array, *, mode: str, block_sources: int = 1, eps: float = 1e-6,
             precision: str = "float64") -> F64:
    """Attention Residuals over depth (K3 report Eqs. 8-10; reference/attn_res.hpp DepthMixer):
    h = sum_i softmax_i(w . RMSNorm(v_i)) v_i per token. v [N, T, d] (v_0 = h_1 the embedding, then the
    sublayer outputs in order); w [d] (the pseudo-query); mode "full" (every source) or "block"
    (block_sources sublayer outputs per block); eps >= 0 of the RMSNorm of the keys. Returns h [T, d].
    Equals `kdalab check --op attn-res` on the same inputs."""

class CheckResult:
    """Metrics of a candidate against a truth (numerics/metrics.hpp) and the verdict of `kdalab check`."""
    name: str
    rel_rms: float       # ||x - truth||_2 / ||truth||_2 (+inf with any NaN/Inf in x)
    max_abs: float       # max |x - truth|
    max_ulp_bf16: int    # largest distance in bf16 units in the last place
    nan_count: int
    inf_count: int
    n: int               # elements
    tol: float           # the budget
    passed: bool         # rel_rms <= tol and no NaN/Inf
    verdict: str         # "x 1.234e-03 <= 5.0e-03", as a line of `kdalab check`

def check(x: Array, truth: Array, *, name: str = "x", tol: float = ...) -> CheckResult:
    """Compares candidate x (float64, float32 or bfloat16; any shape, CPU, C-contiguous) with truth (same
    shape, finite) as `kdalab check` does; tol defaults to CHECK_DEFAULT_TOL (budgets()["check_default"])."""

def budgets() -> dict[str, Tuple[float, str]]:
    """Named budgets of numerics/tolerance.hpp: name -> (value, reason); relative RMS unless the reason
    says otherwise."""

def anchor_kda(B: int, T: int, H: int, D: int, seed: int) -> dict[str, Any]:
    """The "anchor-kda" inputs (numerics/random.hpp anchor_kda), identical to the C++ generator's:
    q_raw, k_raw, q, k [B, T, H, D]; v [B, T, H, D]; g_raw, g [B, T, H, D]; beta_raw, beta [B, T, H];
    A_log [H]; bias [H, D]; S0 [B, H, D, D]; and B, T, H, HV, d_k, d_v, g_min, scale (= D^-1/2), seed,
    generator. Raw tensors hold bf16 values (S0 fp32 values); q, k, g, beta are derived in float64."""

def kda_inputs(B: int, T: int, H: int, d_k: int, d_v: int, *, gate: str = "bounded", g_min: float = -5.0,
               beta: str = "sigmoid", seed: int = 1) -> dict[str, Any]:
    """A named generator of the parity sweep (numerics/kda_inputs.hpp): anchor-kda varied by gate
    ("bounded" | "softplus"), g_min (bounded gate), beta ("sigmoid" | "wide" | "one") and d_v != d_k.
    Keys and shapes as anchor_kda (v [B, T, H, d_v], S0 [B, H, d_k, d_v]); "generator" names it."""

class Rng:
    """The seeded portable generator (numerics/random.hpp: boost mt19937_64 and Boost's distributions)."""
    def __init__(self, seed: int) -> None: ...
    def normal(self, n: int) -> F64:
        """The next n N(0, 1) draws [n]."""
    def uniform(self, n: int, a: float = 0.0, b: float = 1.0) -> F64:
        """The next n U[a, b) draws [n]."""

def fnv1a64(x: Array) -> int:
    """FNV-1a 64-bit hash of the IEEE bit patterns of float64 array x (the generator checksums)."""

def cell_seed(seed: int, cell: str) -> int:
    """The seed of one grid cell (numerics/random.hpp cell_seed)."""

class ResultsFile:
    """The HDF5 results writer of the command line (experiments/results.hpp; docs/results-schema.md): the same
    root attributes (software, software_version, git_sha, date, command_line, config, host, device,
    seed); written to a temporary name and renamed by commit() (or on leaving a `with` block without an
    exception); an existing file is replaced only with force=True."""
    path: str
    def __init__(self, path: str, *, force: bool = False, command_line: str = "", config: str = "{}",
                 seed: str = "") -> None: ...
    def group(self, group: str, description: str) -> None: ...
    def write_array(self, group: str, name: str, array: Array, *, units: str, description: str,
                    attrs: Mapping[str, str] = ...) -> None:
        """An N-d float64 dataset group/name with units, description and string attributes."""
    def write_table(self, group: str, columns: Sequence[Tuple[str, str, str, Sequence[Any]]]) -> None:
        """Columns (name, units, description, values) of equal length as 1-D datasets: values are floats,
        ints or strs."""
    def attr(self, object: str, name: str, value: Union[str, float]) -> None: ...
    def commit(self) -> None: ...
    def __enter__(self) -> "ResultsFile": ...
    def __exit__(self, *exc: Any) -> None: ...

def read_array(file: str, dataset: str) -> F64:
    """A float dataset of an HDF5 file as float64."""

def read_attr(file: str, object: str, name: str) -> Union[float, str]:
    """An attribute of a group or dataset: the text of a string attribute, else its number as a float."""

def members(file: str, group: str) -> list[str]:
    """Names of the members of a group of an HDF5 file."""

def exists(file: str, path: str) -> bool:
    """Whether an HDF5 file holds an object (group or dataset) at path."""
