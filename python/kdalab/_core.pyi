"""Type stubs of kdalab._core: shapes, layouts and dtypes of every function, stated once here.

Conventions (docs/design.md): tensors are row-major [B, T, H, D]; array inputs are float64,
C-contiguous and on the CPU (numpy arrays or torch tensors through DLPack; anything else, a list, a str,
an object-dtype or big-endian array included, raises Error naming the tensor, except None for an array
argument that is not Optional: the binding layer refuses that with TypeError before any check runs);
outputs are new numpy float64 arrays. `precision` is "float64" or "mp50"
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
    g [B, T, HV, d_k] (log-decay, g <= 0); beta [B, T, HV] (in [0, 1]); S0 [B, HV, d_k, d_v] ("KV" layout) or
    None (zero state); every value finite; scale > 0 (usually d_k^-1/2). variant: kda, gated_deltanet, deltanet,
    gla, linear.
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
    A_log [HV]; rms_w [d_v]; x and every weight the layer reads finite. Returns (y [T, hidden], o_core
    [T, HV d_v] (the KDA output before the RMSNorm), S [HV, d_k, d_v])."""

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

# ---- gradients: reverse-mode derivatives (vector-Jacobian products) of the functions above, in
# float64 or mp50 like them; each returns a dict of numpy float64 arrays shaped as the inputs.

def kda_recurrent_backward(q: Array, k: Array, v: Array, g: Array, beta: Array, S0: Optional[Array], dO: Array,
                           dS_T: Optional[Array] = None, *, scale: float, variant: str = "kda", checkpoint: int = 0,
                           precision: str = "float64") -> dict[str, F64]:
    """dL/d(q, k, v, g, beta, S0) of kda_recurrent (docs/equations.md; reference/kda_backward.hpp
    kda_recurrent_backward) for upstream dO = dL/do [B, T, HV, d_v] and dS_T = dL/dS_final
    [B, HV, d_k, d_v] (None: the final state is unused). Inputs as kda_recurrent (S0 None: zero state).
    checkpoint: states kept every `checkpoint` tokens, the rest recomputed (0: all kept; every value
    gives the same bits). Returns {"dq", "dk": [B, T, H, d_k] (summed over a key head's value heads);
    "dv": [B, T, HV, d_v]; "dg": [B, T, HV, d_k]; "dbeta": [B, T, HV]; "dS0": [B, HV, d_k, d_v]}."""

def kda_chunked_backward(q: Array, k: Array, v: Array, g: Array, beta: Array, S0: Optional[Array], dO: Array,
                         dS_T: Optional[Array] = None, *, scale: float, C: int = 64,
                         precision: str = "float64") -> dict[str, F64]:
    """dL/d(q, k, v, g, beta, S0) of the chunked form with chunk size C >= 1 (Kimi Linear sections 3-4;
    reference/kda_chunk_backward.hpp kda_chunked_backward), variant "kda" only; equal to
    kda_recurrent_backward up to rounding. Arguments and result as kda_recurrent_backward. A chunk's
    cumulative log-decay must stay within the factored range (the error names the chunk and g)."""

def gate(z: Array, A_log: Array, bias: Array, *, kind: str = "bounded", g_min: float = -5.0,
         precision: str = "float64") -> F64:
    """The KDA decay gate (reference/gate.hpp gate). kind "bounded" (K3 report Eq. 5):
    g = g_min Sigmoid(e^{A_log[h]} (z + bias)), g_min < 0; "softplus" (Kimi Linear):
    g = -e^{A_log[h]} Softplus(z + bias). z [T, HV d_k] (head h owns columns h d_k .. h d_k + d_k - 1);
    A_log [HV]; bias [HV, d_k]; all finite, and A_log, z + bias such that g is finite in float64 (e^A_log
    overflowing makes the softplus gate -inf, the bounded gate NaN at z + bias = 0: Error naming A_log, the head,
    the token and the column). Returns g [T, HV d_k]."""

def gate_backward(z: Array, A_log: Array, bias: Array, dg: Array, *, kind: str = "bounded", g_min: float = -5.0,
                  precision: str = "float64") -> dict[str, F64]:
    """dL/d(z, A_log, bias) of gate for upstream dg = dL/dg [T, HV d_k] (reference/gate_backward.hpp).
    Inputs as gate, and e^A_log (z + bias) finite in float64 (the bounded gate's derivative is inf * 0 beyond it,
    though g saturates: Error naming A_log, the head, the token and the column). Returns {"dz": [T, HV d_k]; "dA_log": [HV]; "dbias": [HV, d_k]} (the parameters' gradients summed
    over the tokens)."""

def attn_res_backward(v: Array, w: Array, dh: Array, *, mode: str, block_sources: int = 1, eps: float = 1e-6,
                      precision: str = "float64") -> dict[str, F64]:
    """dL/d(v, w) of attn_res for upstream dh = dL/dh [T, d] (reference/attn_res_backward.hpp). Arguments
    as attn_res. Returns {"dv": [N, T, d] (block mode: a source inside a block sum receives that sum's
    gradient); "dw": [d] (summed over the tokens)}."""

def mla_attend(q_C: Array, q_R: Array, C: Array, K_R: Array, W_UK: Array, W_UV: Array, *, n_h: int,
               eval: str = "naive", precision: str = "float64") -> F64:
    """The Gated MLA attention core without the projections and the output gate (DeepSeek-V2 Eqs. 9-19;
    reference/mla.hpp mla_attend_naive, mla_attend_absorbed): per head i, scores
    d_qk^-1/2 (q^C_i (C W_UK,i^T)^T + q^R_i K_R^T), causal softmax, times C W_UV,i^T.
    q_C [T, n_h d_nope]; q_R [T, n_h d_rope] (d_rope may be 0: shape [T, 0]); C [N, d_c] the latent
    cache, N >= T, the T query tokens last (row t attends to cache rows 0 .. N - T + t); K_R [N, d_rope];
    W_UK [n_h d_nope, d_c]; W_UV [n_h d_v, d_c]; head i owns the i-th block of columns (rows of the
    weights). eval "naive" or "absorbed". Returns o [T, n_h d_v]."""

def mla_attend_backward(q_C: Array, q_R: Array, C: Array, K_R: Array, W_UK: Array, W_UV: Array, dO: Array, *,
                        n_h: int, eval: str = "naive", precision: str = "float64") -> dict[str, F64]:
    """dL/d(q_C, q_R, C, K_R, W_UK, W_UV) of mla_attend for upstream dO = dL/do [T, n_h d_v]
    (reference/mla_backward.hpp; naive and absorbed agree to rounding). Arguments as mla_attend.
    Returns {"dq_C", "dq_R", "dC", "dK_R", "dW_UK", "dW_UV"}, each shaped as its input."""

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
    """Compares candidate x (float64, float32 or bfloat16; any shape with at least one element, CPU, C-contiguous)
    with truth (same shape, finite) as `kdalab check` does; tol defaults to CHECK_DEFAULT_TOL
    (budgets()["check_default"]); an empty x is refused (Error): it compares nothing."""

def budgets() -> dict[str, Tuple[float, str]]:
    """Named budgets of numerics/tolerance.hpp: name -> (value, reason); relative RMS unless the reason
    says otherwise."""

BUDGET_FACTOR: float   # F of the budget rule (numerics/tolerance.hpp budget_factor, with its reason)
BUDGET_FLOOR: float    # the least budget (numerics/tolerance.hpp budget_floor)

class Budget:
    """The verdict budget of one quantity by the rule of `kdalab check` (numerics/budget.hpp; docs/check-format.md,
    "The budget rule"): value = max(BUDGET_FACTOR (emulation + output_rounding), BUDGET_FLOOR), relative RMS.
    It depends on the inputs, the declared precision and the output format only, never on a candidate."""
    quantity: str          # "o", "S", "dq", ... (the name in the dict that holds it)
    emulation: float       # relRMS of the plain algorithm at the declared precision vs the float64 truth
    output_rounding: float # relRMS of the truth rounded once to the output format vs the truth
    value: float           # the budget
    precision: str         # the declared precision: "bf16", "fp16", "fp32" or "fp64"
    output_format: str     # the storage format of the quantity: "bf16", "fp16", "tf32", "fp32" or "fp64"
    rule: str              # the rule in words, with F, the floor, the precision and the format
    label: str             # the rule in short, e.g. "rule:F=2 emulation bf16, output bf16"

def budget_of(emulation: Array, truth: Array, *, precision: str, output_format: str, quantity: str = "x") -> Budget:
    """The budget rule on given tensors (numerics/budget.hpp budget_of): emulation (the plain algorithm at
    `precision`) and truth, float64 of one shape (the truth finite); output_format the quantity's storage format.
    precision: bf16, fp16, fp32, fp64 (or bfloat16, float16, float32, float64); output_format also tf32."""

def budget_kda(q: Array, k: Array, v: Array, g: Array, beta: Array, S0: Optional[Array] = None, *, scale: float,
               precision: str, output_format: Union[None, str, Mapping[str, str]] = None, gate: str = "none",
               A_log: Optional[Array] = None, bias: Optional[Array] = None, g_min: float = -5.0,
               l2norm_qk: bool = False, beta_logits: bool = False, cu_seqlens: Optional[Sequence[int]] = None,
               dO: Optional[Array] = None, dS_T: Optional[Array] = None, chunk: int = 64) -> dict[str, Budget]:
    """Budgets of a KDA call (`kdalab check --op kda`, and `--op kda-bwd` with dO) by the rule of `kdalab check`:
    the plain chunked algorithm at the declared precision (numerics/plain_emulation.hpp emul::kda, chunk C; 1 is the
    recurrence, as --op kda-decode) against the float64 truth (reference/kda.hpp, numerics/check_ops.hpp) on exactly
    these inputs, as the candidate receives them.

    q, k [B, T, H, d_k]; v [B, T, HV, d_v]; g [B, T, HV, d_k]: the log-decay (gate "none", g <= 0) or the gate
    logits z (gate "k3": g_min Sigmoid(e^A_log (z + bias)); "softplus": -e^A_log Softplus(z + bias); A_log [HV],
    bias [HV, d_k]); beta [B, T, HV]: values, or logits with beta_logits (Sigmoid); l2norm_qk: q and k are
    L2-normalised per head first (eps 0); S0 [B, HV, d_k, d_v] ("KV") or None (zero). cu_seqlens [N + 1]: B = 1,
    N sequences packed along T, S0 [N, HV, d_k, d_v]; each sequence is emulated and judged on its own, the budget
    taken over all of them. dO [B, T, HV, d_v] (dL/do) and dS_T [B, HV, d_k, d_v] (dL/dS_T, None: unused): the
    gradients too (no cu_seqlens).

    Returns quantity -> Budget: "o" [B, T, HV, d_v] and "S" (the final state); with dO also "dq", "dk", "dv",
    "dg" (w.r.t. g as given), "dbeta" (w.r.t. beta as given), "dS0", and with a gate "dA_log", "dbias".
    precision: the candidate's declared precision (bf16, fp16, fp32, fp64; numpy names accepted).
    output_format: None (every quantity stored at the declared precision), one format for all, or a dict
    quantity -> format (the others at the declared precision). Errors: Error naming the tensor or option."""

def budget_mla(q: Array, c: Array, q_rope: Optional[Array] = None, k_rope: Optional[Array] = None, *, scale: float,
               precision: str, output_format: Union[None, str, Mapping[str, str]] = None,
               lens: Optional[Sequence[int]] = None, dO: Optional[Array] = None) -> dict[str, Budget]:
    """Budgets of the absorbed MLA attention core (`kdalab check --op mla`, and `--op mla-bwd` with dO) by the rule
    of `kdalab check`: the naive attention at the declared precision (numerics/plain_emulation.hpp emul::mla)
    against check's float64 truth (numerics/check_ops.hpp mla_check_truth: reference/mla.hpp's absorbed attention
    with W_UK = W_UV = I) on exactly these inputs.

    q [B, T, H, d_c] (absorbed queries), c [B, N, d_c] (latent cache), q_rope [B, T, H, d_rope] and k_rope
    [B, N, d_rope] (both or neither), softmax scale; query t of row b sits at position L_b - T + t and reads cache
    tokens 0 .. L_b - 1, L_b = lens[b] (T <= L_b <= N; default N). Decode: T = 1, q[:, None].
    dO [B, T, H, d_c]: the gradients too.

    Returns quantity -> Budget: "o" [B, T, H, d_c]; with dO also "dq", "dc" (and "dq_rope", "dk_rope").
    precision and output_format as budget_kda. Errors: Error naming the tensor or option."""

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

def mqar(n: int, seq_len: int, num_kv_pairs: int, vocab: int, seed: int, *, power_a: float = 0.01,
         random_non_queries: bool = True) -> dict[str, Any]:
    """Zoology's multi-query associative recall (numerics/recall_tasks.hpp mqar; Arora et al. 2023, sec. 3.1),
    identical to the C++ generator's: "inputs" and "targets" int64 [n, seq_len] (targets IGNORE_INDEX = -100 where
    not scored), and "task", "n", "seq_len", "vocab", "seed", "checksum" (FNV-1a 64 of inputs then targets).
    Keys from [1, vocab/2), values from [vocab/2, vocab); each key queried once at a power-law gap
    P(g) ~ (g + 1)^(power_a - 1). Errors: Error naming the argument, its value and what is accepted, for every bad
    argument of the three tasks: sizes and vocab integers in [1, 2^63 - 1] and seed in [0, 2^64 - 1] (int or numpy
    integer; not bool, float, None), power_a a number, random_non_queries a bool, n x seq_len <= 2^28 tokens
    (MAX_TASK_TOKENS; 2 GiB per array), the task's own bounds."""

def palindrome(n: int, seq_len: int, vocab: int, seed: int) -> dict[str, Any]:
    """The Palindrome task (numerics/recall_tasks.hpp palindrome; Kimi Linear report sec. 5.1): seq_len / 2
    tokens from [2, vocab), the separator 1, then the reversed tokens; the second half is scored. Keys as mqar."""

def stack_task(n: int, seq_len: int, vocab: int, num_stacks: int, seed: int) -> dict[str, Any]:
    """The Stack task (numerics/recall_tasks.hpp stack_task; Kimi Linear report sec. 5.1): seq_len / 2 push or
    pop operations on num_stacks stacks (push s: token 2 + s and a value from [2 + 2 num_stacks, vocab); pop s:
    token 2 + num_stacks + s, scored, then the popped value). Keys as mqar."""

IGNORE_INDEX: int
MAX_TASK_TOKENS: int  # the most tokens n x seq_len one call of mqar, palindrome or stack_task returns (2^28)

class Rng:
    """The seeded portable generator (numerics/random.hpp: boost mt19937_64 and Boost's distributions)."""
    def __init__(self, seed: int) -> None: ...
    def normal(self, n: int) -> F64:
        """The next n N(0, 1) draws [n]."""
    def uniform(self, n: int, a: float = 0.0, b: float = 1.0) -> F64:
        """The next n U[a, b) draws [n]; a < b, both finite."""

def fnv1a64(x: Array) -> int:
    """FNV-1a 64-bit hash of the IEEE bit patterns of float64 array x (the generator checksums)."""

def cell_seed(seed: int, cell: str) -> int:
    """The seed of one grid cell (numerics/random.hpp cell_seed)."""

def check_output_path(path: str, *, force: bool = False) -> None:
    """The results writer's checks of an output path, made before anything runs (experiments/results.cpp
    check_output_path; docs/cli.md): Error (bad input, exit 2) for an empty path, a folder, a missing folder, an
    existing file without force, a special file or a name too long; RuntimeError (exit 5) when the folder is not
    writable. Writes nothing."""

class ResultsFile:
    """The HDF5 results writer of the command line (experiments/results.hpp; docs/results-schema.md): the same
    root attributes (software, software_version, git_sha, date, command_line, config, host, device,
    seed); written to a temporary name and renamed by commit() (or on leaving a `with` block without an
    exception); an existing file is replaced only with force=True. Names: Error for a NUL in any name or text, an
    empty array, column or attribute name, a '/' in an array or column name, a group part . or .., an array or
    column its group already holds (or one table gives twice), and a group path through an array. commit() closes the
    file: any call after it raises Error."""
    path: str
    def __init__(self, path: str, *, force: bool = False, command_line: str = "", config: str = "{}",
                 seed: str = "") -> None: ...
    def group(self, group: str, description: str) -> None: ...
    def write_array(self, group: str, name: str, array: Array, *, units: str, description: str,
                    attrs: Mapping[str, str] = ...) -> None:
        """An N-d float64 dataset group/name with units, description and string attributes."""
    def write_table(self, group: str, columns: Sequence[Tuple[str, str, str, Sequence[Any]]]) -> None:
        """Columns (name, units, description, values) of equal length as 1-D datasets: values are floats,
        ints (int64 datasets, each value exact; within [-2^63, 2^63 - 1]) or strs, the kind of a column's first value;
        another value raises Error naming the column and the value."""
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

# ---- CUDA builds only (KDALAB_CUDA; built_with_cuda is True): kdalab's kernels on CUDA arrays through
# DLPack (torch tensors), every array the caller's (outputs and workspace included), every launch on
# `stream` (a cudaStream_t as an int; 0 the legacy default stream). The wrappers of kdalab.cuda
# allocate with torch and pass torch's current stream. Errors: Error naming the tensor (device,
# dtype, shape, C-contiguity) or the kernel's argument, before anything is launched.

def cuda_kda_prefill_workspace_bytes(B: int, T: int, H: int, HV: int, D: int, *, single_stream: bool = False,
                                     num_seqs: int = 0, precision: str = "fast") -> int:
    """Bytes of the workspace cuda_kda_prefill needs for these shapes (kernels/kda.hpp kda_prefill_workspace_bytes);
    num_seqs > 0: num_seqs packed sequences (cu_seqlens, B = 1); precision as cuda_kda_prefill's ("accurate" adds
    8 KB per 16-token chunk and value head)."""

def cuda_kda_prefill(q: Array, k: Array, v: Array, g: Array, beta: Array, A_log: Array, bias: Array, o: Array,
                     S0: Optional[Array], S_final: Optional[Array], workspace: Array, *, g_min: float, scale: float,
                     l2norm_qk: bool = True, beta_sigmoid: bool = True, single_stream: bool = False,
                     stream: int = 0, cu_seqlens: Optional[Array] = None, max_seqlen: int = 0,
                     gate_fused: bool = True, precision: str = "fast") -> None:
    """KDA chunked prefill (kernels/kda.hpp kda_prefill; K3 report Eqs. 1, 5) with the fused K3 gate
    g = g_min Sigmoid(e^A_log (g + bias)), L2-normalised q, k (l2norm_qk) and beta = Sigmoid(beta) (beta_sigmoid).
    q, k [B, T, H, D] bf16; v, g [B, T, HV, D] bf16 (g the raw gate logits); beta [B, T, HV] bf16; A_log [HV]
    fp32; bias [HV, D] fp32; out o [B, T, HV, D] bf16; S0, S_final [B, HV, D, D] fp32 ("KV" layout) or None;
    workspace uint8 [>= cuda_kda_prefill_workspace_bytes]. D in {64, 128, 256}; -5 <= g_min < 0.
    single_stream: no side stream (for CUDA-graph capture). cu_seqlens: int32 [N + 1] offsets of N packed
    sequences (B = 1; S0, S_final then [N, HV, D, D]; max_seqlen the longest). gate_fused = False: g is the
    log-decay itself, in [-5, 0] by the caller's guarantee (A_log, bias not read). precision (kernels/kda.hpp
    KdaPrecision): "fast" (bf16 state-product operands) or "accurate" (S, Qg and D, Kd as bf16 hi + lo: o at the bf16
    floor on long-memory and repeated-key inputs; D = 128 only, with a workspace sized for it)."""

def cuda_kda_backward_workspace_bytes(B: int, T: int, H: int, HV: int, D: int, *, num_seqs: int = 0) -> int:
    """Bytes of the workspace cuda_kda_backward needs for these shapes on the current device
    (kernels/kda_backward.hpp kda_backward_workspace_bytes); num_seqs > 0: packed sequences (cu_seqlens, B = 1)."""

def cuda_kda_backward(q: Array, k: Array, v: Array, g: Array, beta: Array, A_log: Optional[Array],
                      bias: Optional[Array], dO: Array, S0: Optional[Array], dS_T: Optional[Array], dq: Array,
                      dk: Array, dv: Array, dg: Array, dbeta: Array, dA_log: Optional[Array], dbias: Optional[Array],
                      dS0: Optional[Array], workspace: Array, *, g_min: float, scale: float, l2norm_qk: bool = True,
                      beta_sigmoid: bool = True, gate_fused: bool = True, cu_seqlens: Optional[Array] = None,
                      max_seqlen: int = 0, stream: int = 0) -> None:
    """KDA backward (kernels/kda_backward.hpp kda_backward; docs/kernels/kda_backward.md): the gradients of
    cuda_kda_prefill on the same inputs for upstream dO = dL/do [B, T, HV, D] bf16 and dS_T = dL/dS_final
    [N, HV, D, D] fp32 (None: the final state is unused). Inputs as cuda_kda_prefill (A_log, bias: with
    gate_fused only). Outputs, written in place: dq, dk [B, T, H, D] bf16 (of the raw q, k; summed over a key
    head's value heads); dv, dg [B, T, HV, D] bf16 (dg: of the g input, the raw logits when gate_fused);
    dbeta [B, T, HV] bf16 (of the logits when beta_sigmoid); dq, dk, dg, dbeta may instead all be float32 (the
    gradients before their bf16 rounding, for a caller that sums several calls and rounds once); dA_log [HV], dbias [HV, D] fp32 (gate_fused only,
    summed over all tokens); dS0 [N, HV, D, D] fp32 or None. workspace uint8 [>= cuda_kda_backward_workspace_bytes].
    fp32 inside, deterministic (no atomics); no allocation, capturable in a CUDA graph."""

def cuda_kda_decode(q: Array, k: Array, v: Array, g: Array, beta: Array, A_log: Array, bias: Array, state: Array,
                    o: Array, *, g_min: float, scale: float, l2norm_qk: bool = True, beta_sigmoid: bool = True,
                    stream: int = 0, gate_fused: bool = True) -> None:
    """One KDA decode step (kernels/kda.hpp kda_decode), capturable in a CUDA graph: q, k [B, H, D] bf16;
    v, g [B, HV, D] bf16; beta [B, HV] bf16; A_log, bias as cuda_kda_prefill; state [B, HV, D, D] fp32
    updated in place (the prefill's S_final); out o [B, HV, D] bf16. gate_fused = False: g is the log-decay
    (as cuda_kda_prefill)."""

def cuda_mla_absorb_query(q_C: Array, W_UK: Array, q_hi: Array, q_lo: Array, *, stream: int = 0) -> None:
    """The absorbed MLA query q~ = W_UK,i^T q^C_i in fp32 split into bf16 q_hi + q_lo (kernels/mla_prefill.hpp
    mla_absorb_query): q_C [n, H, d_nope] bf16; W_UK [H d_nope, d_c] bf16; out q_hi, q_lo [n, H, d_c] bf16; d_c = 512."""

def cuda_mla_decode_workspace_bytes(B: int, H: int, capacity: int, max_len: int, *, s_q: int = 1,
                                    precision: str = "auto") -> int:
    """Bytes of the workspace cuda_mla_decode needs (kernels/mla.hpp mla_decode_workspace_bytes) for s_q query
    tokens per sequence in `precision` ("auto", "accurate" or "fast")."""

def cuda_mla_decode(q_hi: Array, q_lo: Optional[Array], c: Array, out: Array, workspace: Array,
                    lens: Optional[Array] = None, *, max_len: int, scale: float, precision: str = "auto",
                    stream: int = 0) -> None:
    """One absorbed MLA decode step (kernels/mla.hpp mla_decode), capturable in a CUDA graph: the attended
    latent a = softmax(scale q~ C^T) C per (sequence, query token, head). q_hi [B, H, d_c] (one query token) or
    [B, s_q, H, d_c] (multi-token decode, s_q <= 4: the last s_q cached tokens, query j reading the positions
    0 .. len - s_q + j) bf16; q_lo of the same shape (precision "accurate") or None ("fast"); precision "auto" is
    accurate for s_q = 1 and fast for s_q > 1 (kernels/mla.hpp MlaDecodePrecision). Latent cache c [B, N_max, row]
    bf16 (row = d_c = 512, or 576 with k^R in each row); out a fp32 of q_hi's shape; workspace uint8 [>=
    cuda_mla_decode_workspace_bytes]; lens int32 [B] on the GPU or None (every sequence max_len tokens); s_q <=
    max_len <= N_max; H in {16, 32}; scale = (d_nope + d_rope)^-1/2."""

def cuda_mla_prefill_workspace_bytes(B: int, T: int, H: int, capacity: int, prefix: int, *, path: str = "auto",
                                     precision: str = "auto") -> int:
    """Bytes of the workspace cuda_mla_prefill needs (kernels/mla_prefill.hpp mla_prefill_heads_workspace_bytes)."""

def cuda_mla_prefill(c: Array, q_C: Array, W_UK: Array, W_UV: Array, out: Array, workspace: Array,
                     c_new: Optional[Array] = None, *, prefix: int, scale: float, path: str = "auto",
                     precision: str = "auto", stream: int = 0) -> None:
    """Causal MLA prefill of T new tokens behind `prefix` cached ones with per-head output o_i = W_UV,i a_i
    (kernels/mla_prefill.hpp mla_prefill_heads; path "auto" (the FLOP rule), "absorbed" or "naive"). c [B, N_max,
    row] bf16, rows prefix .. prefix + T - 1 written from c_new [B, T, d_c] bf16 (None: already there); q_C
    [B, T, H, d_nope] bf16; W_UK [H d_nope, d_c], W_UV [H d_v, d_c] bf16; out o [B, T, H, d_v] fp32 (or bf16 with
    precision "fast" and a wgmma form: the fp32 o rounded to bf16); workspace
    uint8 [>= cuda_mla_prefill_workspace_bytes]. d_c = 512, d_nope = d_v = 128. precision "auto" (the rule:
    accurate), "accurate" (K, V and P as bf16 hi + lo, ~5e-6 relative RMS) or "fast" (bf16 K, V and P, one pass
    per product, ~2.4e-3 .. 4.2e-3; the naive path only) (kernels/mla_prefill.hpp MlaPrefillPrecision). Its first
    call creates a cuBLAS handle (not capturable)."""

def cuda_attn_res(src: Array, w: Array, out: Array, *, eps: float = 1e-6, stream: int = 0) -> None:
    """Attention Residuals over S sources (kernels/attn_res.hpp attn_res; K3 report Eqs. 8-10): per token
    softmax_i(w . RMSNorm(src_i)) weighted sum of the raw sources. src [S, T, d] bf16 (d a multiple of 8);
    w [d] fp32; out [T, d] fp32 or bf16."""
