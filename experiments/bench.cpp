// `kdalab bench`: timings of the CUDA kernels: KDA (kernels/kda.hpp) and its backward (kernels/kda_backward.hpp), MLA
// decode and prefill (kernels/mla.hpp, kernels/mla_prefill.hpp) and Block AttnRes (kernels/attn_res.hpp).
//
//   kdalab bench --op kda-prefill|kda-decode|kda-backward|mla-decode|mla-prefill|attn-res|all
//                [--shapes "B:T:H[:HV[:D]],..." (mla-prefill: "B:T:H[+N0],...")]
//                [--iters N] [--warmup N] [--quick] [--prefix N0] [--peer-json FILE..] [--compare BASELINE.h5..]
//                [--state-pass auto|mma|wgmma|key-split] [--segments P] [--overlap on|off] [--precision fast|accurate]
//                [--s-q 1..4] [--mla-precision auto|accurate|fast] [--ring-depth 0|2..8] --out results/bench.h5
//
// Per shape: median (and min) of --iters CUDA-event timings after --warmup launches, the bytes a
// kernel must move at least (inputs read once, outputs written once; the workspace is not counted)
// and the FLOPs of its algorithm, TB/s and TFLOP/s, and % of the ceilings: the device-to-device
// copy bandwidth measured in the same run (1 GiB, bytes read + written) and the bf16 matmul rate
// of an H200 (715 TFLOP/s, dense, a datasheet-level figure: not re-measured). KDA decode at B <= 8 is timed as one CUDA graph
// of 100 steps (per-step time reported); MLA decode as single launches, with the per-step time in a graph of 20 steps
// beside them (graph_ms). Inputs are seeded device-side N(0,1) bf16 fills (never zeros).
// --peer-json: a JSON object {"<op> B=.. T=.. H=.. HV=..": milliseconds} written by a peer timing
//   script run on the same machine just before (fla); adds peer_ms and speedup = peer_ms / time_ms. --out is never one of
//   the --peer-json files (checked as for --compare).
// --compare: prints time / baseline time per row found in the BASELINE.h5 files (same group, same key; the first
//   file holding the key wins) and
//   flags rows more than 10% slower; exit code 1 when any row is flagged (the regression check); prints how many rows
//   had no baseline row. Each file is read completely before any GPU work: /bench a group, each /bench/<op> group
//   that bench would read with a 1-D string `key` and a numeric `time_ms` (finite, > 0) of the same length; --out
//   is never one of the --compare files (same file through a symlink or another spelling included).
// mla-decode (kernels/mla.hpp): shapes B:N:H with N the cached tokens per sequence (d_c = 512, bf16
//   latent cache), --s-q query tokens per sequence (the last s_q cached ones, causal; default 1) in the precision of
//   --mla-precision (auto: kernels/mla.hpp mla_decode_precision_rule, accurate for s_q = 1 with q~ as bf16 hi + lo,
//   fast for s_q > 1 with the bf16 query alone); bytes = the latent reads B N d_c 2 only (TB/s of latent reads; every
//   row read once for all s_q tokens), flops = 4 B H N d_c s_q (scores and P C, one pass per query row: 65,536 s_q
//   FLOP per cached token at H = 32; the hi/lo passes of accurate are not counted, nor the <= s_q - 1 masked tokens).
//   Rows with s_q > 1 get the key suffix " s_q=<s_q>", rows whose precision is not the rule's " fast" or " accurate"
//   (their own baselines; the peer time is looked up under the key without the precision suffix). The library's
//   automatic plan and output path (kernels/mla.hpp mla_decode_plan), printed per shape; --mla-splits N > 0 forces
//   the slice count (MlaDecodeOverrides::num_splits; key suffix " splits=N", peer looked up without it).
// mla-prefill (kernels/mla_prefill.hpp): shapes B:T:H[+N0] with T new tokens behind a cached prefix of N0 tokens:
//   the shape's own +N0, else --prefix (default 0; a shape's own N0 wins over --prefix). Rows with N0 > 0 get the key
//   suffix " N0=<N0>" (rows with N0 = 0 keep their keys). Defaults 1:8192:32, 1:2048:32, 8:512:32 (N0 = --prefix) and
//   1:2048:32+32768 (2048 new tokens behind a 32K-token cached prefix). time = append + causal absorbed attention
//   (q~ hi/lo given); prepare_ms = the query absorption (mla_absorb_query, d_nope = 128) alone; bytes = latent cache
//   read once, c_new read + written, q_hi/q_lo read, the fp32 attended latent written; flops = 4 d_c H per causal (query, key) pair (one pass,
//   hi/lo not counted).
//   Each shape also gets a row "mla-prefill-naive B=.. T=.. H=.. HV=..": kernels/mla_prefill.hpp mla_prefill_heads with
//   the naive path forced (MlaPrefillOverrides; append + K, V reconstruction by cuBLAS + hi/lo split + causal flash attention, o = W_UV a per head,
//   [B, T, H, 128] fp32); bytes = latents, c_new, q^C, W_UK, W_UV read, o written (fp32 K, V workspace not counted);
//   flops = 4 d_h H per causal pair + 2 d_c (d_nope + d_v) H per key (one pass, hi/lo not counted). A printed line
//   gives the rule's choice, the absorbed path through the same API (absorb + prefill + W_UV) and P hi only.
//   And a row "mla-prefill-fast B=.. T=.. H=.. HV=..": the same call in precision fast (MlaPrefillPrecision::fast:
//   bf16 K, V and P, one pass per product), bytes and flops counted as the naive row's; its peer time is torch's
//   (bench/torch_mla_prefill.py: the K, V products and SDPA on its fastest backend).
// kda-prefill / kda-decode / kda-backward: D = d_k = d_v is the optional 5th shape field (64, 128 or 256; default
//   128); rows with D != 128 carry " D=<D>" at the end of their key (D = 128 keys are unchanged). The kda-prefill and
//   kda-decode defaults add D = 64 and D = 256 rows. kda-prefill: --state-pass and --segments force a state pass and schedule
//   (kernels/kda.hpp KdaPrefillOverrides), --overlap off runs everything on one stream (KdaPrefillArgs::single_stream);
//   prep ms and state ms time the prepare and the state pass alone (KdaPrefillOverrides::phases).
// kda-backward (kernels/kda_backward.hpp; shapes B:T:H[:HV[:D]] as kda-prefill, defaults 1:8192:64, 1:8192:96,
//   1:65536:32): kda-prefill's inputs (the fused K3 gate, L2Norm and beta sigmoid, S0 given, S_final written) plus the
//   upstream dO N(0,1) bf16 and dS_T N(0,1) fp32. Three timings, each as kda-prefill's: the forward (kda_prefill, the
//   rule's plan: --state-pass, --segments, --overlap act on kda-prefill rows only), the backward (kda_backward) and
//   the forward then the backward, per call of a CUDA graph (as bench/fla_kda.py times fla; the eager time is printed
//   beside it); time_ms = the last, fwd_ms and bwd_ms the first two (printed as fwd ms, bwd ms).
//   bytes, flops = the prefill's model + the backward's (bwd_bytes, bwd_flops: backward_model below); peak_bytes =
//   the device bytes the row allocates (inputs, outputs, the prefill and backward workspaces), printed with the
//   backward's own TB/s and TFLOP/s.
// attn-res (kernels/attn_res.hpp): shapes S:T:d in the B:T:H slots (S sources, T tokens, width d; the table's
//   B, T, H, D columns hold S, T, d, d); bytes = the S T d bf16 sources read once + the bf16 output written;
//   flops = 6 S T d (h.h, w.h, the weighted sum). --ring-depth n (AttnResArgs::ring_depth: 0 = the rule's 3, else 2..8
//   row buffers a CTA, 4 d + 2 d n bytes of shared memory <= 231808) times a deeper or shallower ring; rows with a
//   depth other than the rule's get the key suffix " ring=<n>" (their own baselines; the peer time is looked up under
//   the plain key). The printed lines also time 1 and 4 tokens a CTA, and every vectors-a-thread count above the
//   rule's (AttnResArgs::vectors_per_thread) at the rule's, 1 and 4 tokens a CTA.
// Order of the checks (the same errors, exit 2, in every build): --op, the numbers (--iters, --warmup, --prefix,
// --segments, --s-q), option values and combinations (--mla-precision accurate with --s-q > 1 among them), options the
// op ignores (--prefix > 0 without mla-prefill, --state-pass other than auto, --segments != 0 or --overlap off without
// kda-prefill, --s-q != 1 or --mla-precision other than auto without mla-decode, --ring-depth != 0 without attn-res;
// --op all takes each of them, it acts on that op's rows), --shapes (fields the
// op ignores refused: HV != H for the MLA ops, a 4th
// attn-res field, a +N0 prefix on a shape of another op than mla-prefill; an mla-prefill N0 + T, from the shape's +N0
// or --prefix, above 2^31 - 1; an mla-decode shape with N < --s-q; an attn-res d whose ring of --ring-depth rows does
// not fit in shared memory), the --peer-json files, the --compare files (Command::check),
// then cli::run's shared path: --out not one of the input files (--config, --compare, --peer-json), then --out
// (folder exists and is writable; an existing file only with --force). Only then (Command::run): without the CUDA
// kernels (CPU build) or without a visible GPU, one line on stderr saying so, nothing written, exit 3
// (kExitNotAvailable: "cannot run in this build / on this machine"; not 0, so a GPU-less CI gate running
// `bench --compare` fails instead of passing with nothing compared; not 2, which is bad input).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <H5Cpp.h>

#include <cctype>
#include <cstring>
#include <filesystem>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "experiments/cli.hpp"
#include "kernels/attn_res_limits.hpp"
#include "reference/error.hpp"

#ifdef KDALAB_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/attn_res.hpp"
#include "kernels/kda.hpp"
#include "kernels/kda_backward.hpp"
#include "kernels/mla.hpp"
#include "kernels/mla_prefill.hpp"
#include "kernels/common/random_fill.hpp"
#include "kernels/common/stream_read.hpp"
#endif

namespace kdalab::cli {

namespace {

/// Exit code of `kdalab bench` when the benchmark cannot run here: a build without the CUDA kernels, or no
/// GPU visible. Distinct from 0 (measured), 1 (a row > 10% slower than --compare, or an unexpected failure)
/// and 2 (bad input).
constexpr int kExitNotAvailable = 3;

struct BenchOptions {
  std::string op = "all", shapes;
  std::vector<std::string> peer_json, compare;  // several files: peers merged, baselines searched in order
  int iters = 30, warmup = 5;
  std::string kda_state_pass = "auto";  // kda-prefill: KdaPrefillOverrides::state_pass (auto, mma, wgmma, key-split)
  int kda_segments = 0;  // kda-prefill schedule: 0 the rule, 1 one-shot, 2..64 the segment path with P segments
  std::string kda_overlap = "on";  // kda-prefill: off = KdaPrefillArgs::single_stream
  std::string kda_precision = "fast";  // kda-prefill: KdaPrefillArgs::precision (fast, accurate; D = 128)
  std::string bwd_pass = "auto";  // kda-backward: KdaBackwardOverrides::pass (auto, sweep, chunked, chunked_wg)
  long long prefix = 0;  // mla-prefill: cached tokens before the T new ones
  int s_q = 1;  // mla-decode: query tokens per sequence (MlaDecodeArgs::s_q)
  std::string mla_precision = "auto";  // mla-decode: MlaDecodeArgs::precision (auto, accurate, fast)
  int mla_splits = 0;  // mla-decode: MlaDecodeOverrides::num_splits (0 = the plan's choice)
  int ring_depth = 0;  // attn-res: AttnResArgs::ring_depth (0 = the rule's 3, else 2..8 row buffers)
};

/// attn-res: the kernel's ring-depth limits (kernels/attn_res_limits.hpp), for the checks made in every build.
constexpr int kRingDepthRule = kernels::attn_res_ring_depth_rule, kRingDepthMax = kernels::attn_res_ring_depth_max;
constexpr long long kAttnResSmemMax = kernels::attn_res_smem_dyn_max;

struct Shape {
  long long B, T, H, HV;
  long long D = 128;  // kda-prefill / kda-decode: d_k = d_v
  long long N0 = 0;  // mla-prefill: cached tokens before the T new ones (the shape's own +N0, else --prefix)
  bool naive = false;  // mla-prefill: the naive-path row (mla_prefill_heads, naive path forced) of this shape
  bool fast = false;   // mla-prefill: with naive, the row of mla_prefill_heads in precision fast
  bool operator==(const Shape&) const = default;
};

/// The shapes of `op` from --shapes `text` ("" for the op's defaults). mla-prefill: a shape's N0 is its own (B:T:H+N0)
/// or else `prefix` (--prefix, typed as `prefix_typed`); N0 + T must fit the kernel's 32-bit token counts.
std::vector<Shape> parse_shapes(const std::string& text, const std::string& op, long long prefix = 0,
                                const std::string& prefix_typed = "") {
  constexpr long long kMaxField = 2147483647LL;  // 2^31 - 1: the kernels take int sizes
  // mla-prefill: --prefix applies to the shapes without their own prefix; prefix + T counted in 32-bit ints by the
  // kernel, refused here in every build (a CPU build gives exit 2 for such a value, not 3 "not available"), quoting
  // --prefix as typed
  const auto with_prefix = [&](Shape s) {
    require(prefix <= kMaxField - s.T,
            "--prefix " + (prefix_typed.empty() ? std::to_string(prefix) : prefix_typed) + " with T = " +
                std::to_string(s.T) + " (shape " + std::to_string(s.B) + ":" + std::to_string(s.T) + ":" +
                std::to_string(s.H) + "): prefix + T is above 2^31 - 1; accepted: 0 <= prefix and prefix + T <= "
                "2^31 - 1 (2147483647)");
    s.N0 = prefix;
    return s;
  };
  std::vector<Shape> r;
  if (text.empty()) {
    if (op == "kda-prefill")
      return {{1, 8192, 64, 64}, {1, 8192, 96, 96}, {1, 65536, 32, 32}, {4, 4096, 16, 32}, {1, 8192, 64, 64, 64},
              {1, 8192, 32, 32, 256}};
    // mla-decode: the three goal shapes (docs/kernels/mla_decode.md), a short context and a small batch of short
    // contexts (the plan's 64-token slices and the combine's warps per CTA; guarded by data/baselines/h200.h5),
    // 256 x 4K (one slice per sequence: the direct output)
    if (op == "mla-decode")
      return {{1, 65536, 32, 32}, {1, 1048576, 32, 32}, {64, 32768, 32, 32}, {1, 8192, 32, 32}, {8, 8192, 32, 32},
              {256, 4096, 32, 32}};
    // mla-prefill: three prompts without a cached prefix (N0 = --prefix) and 2048 new tokens behind a 32K-token cached
    // prefix (a chunk of a long prompt; its own N0, whatever --prefix is); a row that --prefix makes equal to another
    // is timed once
    if (op == "mla-prefill") {
      for (const Shape& s : {with_prefix({1, 8192, 32, 32}), with_prefix({1, 2048, 32, 32}),
                             with_prefix({8, 512, 32, 32}), Shape{1, 2048, 32, 32, 128, 32768}})
        if (std::find(r.begin(), r.end(), s) == r.end()) r.push_back(s);
      return r;
    }
    // attn-res: S:T:d (K3: 8 completed blocks + the embedding = 9 sources, 10 with the partial sum, d = 7168;
    // Kimi Linear: d = 2304)
    if (op == "attn-res") return {{9, 8192, 7168, 7168}, {10, 8192, 7168, 7168}, {9, 8192, 2304, 2304}};
    // kda-backward: the first three kda-prefill shapes (fla's chunk_kda forward + backward is timed on the same keys);
    // the T = 65536 row allocates ~20 GB (inputs, outputs, both workspaces; docs/kernels/kda_backward.md, "Measuring")
    if (op == "kda-backward") return {{1, 8192, 64, 64}, {1, 8192, 96, 96}, {1, 65536, 32, 32}};
    return {{256, 1, 32, 32}, {1, 1, 32, 32}, {64, 1, 32, 64}, {256, 1, 32, 32, 64}, {256, 1, 32, 32, 256}};
  }
  const bool kda = op == "kda-prefill" || op == "kda-decode" || op == "kda-backward";
  const std::string form = kda                  ? "B:T:H[:HV[:D]]"
                           : op == "mla-decode"  ? "B:N:H"
                           : op == "attn-res"    ? "S:T:d"
                           : op == "mla-prefill" ? "B:T:H[+N0]"
                                                 : "B:T:H";
  require(text.back() != ',', "--shapes: '" + text + "' ends with ','; accepted: comma-separated " + form);
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const int nmax = kda ? 5 : 4;  // kda: a 5th field D
    // mla-prefill: "+N0" after the last field names the shape's own cached prefix (a '+' after a digit; a '+' that
    // begins a field is an integer's sign, as before)
    std::string fields = item;
    long long own = -1;  // the shape's own N0; -1: none named (--prefix applies)
    if (const std::size_t plus = item.rfind('+'); plus != std::string::npos && plus > 0 &&
                                                 std::isdigit(static_cast<unsigned char>(item[plus - 1]))) {
      const std::string p = item.substr(plus + 1);
      require(op == "mla-prefill", "--shapes: '" + item + "' names a cached prefix (+" + p +
                                       "); only mla-prefill shapes take one (B:T:H+N0); accepted: " + form);
      const std::string accepted = "; accepted: B:T:H+N0 with N0 >= 0 cached tokens (decimal digits) and N0 + T <= "
                                   "2^31 - 1 (2147483647)";
      require(!p.empty() && p.find_first_not_of("0123456789") == std::string::npos,
              "--shapes: prefix '" + p + "' in '" + item + "' is not an integer >= 0" + accepted);
      try {
        own = std::stoll(p);
      } catch (const std::out_of_range&) {
        own = std::numeric_limits<long long>::max();  // refused below with the same message as any too-large N0
      }
      require(own <= kMaxField, "--shapes: prefix '" + p + "' in '" + item + "' is too large" + accepted);
      fields = item.substr(0, plus);
    }
    require(fields.empty() || fields.back() != ':', "--shapes: '" + item + "' ends with ':'; accepted: " + form);
    long long v[5] = {0, 0, 0, 0, 128};
    int n = 0;
    std::stringstream is(fields);
    std::string f;
    while (std::getline(is, f, ':')) {
      require(n < nmax, "--shapes: '" + item + "' has more than " + std::to_string(nmax) + " fields; accepted: " + form);
      std::size_t used = 0;
      bool too_large = false;
      try {
        v[n] = std::stoll(f, &used);
      } catch (const std::out_of_range&) {
        too_large = true;
      } catch (...) {
        used = 0;
      }
      require(!too_large, "--shapes: '" + f + "' in '" + item + "' is too large; accepted: " + form +
                              " with each field in [1, 2^31 - 1]");
      // the whole field an integer: std::stoll alone would also skip leading blanks (" 1:2:3" read as "1:2:3")
      require(used > 0 && used == f.size() && !std::isspace(static_cast<unsigned char>(f.front())),
              "--shapes: '" + f + "' in '" + item + "' is not an integer; accepted: " + form);
      require(v[n] <= kMaxField, "--shapes: '" + f + "' in '" + item + "' is too large (2^31 - 1 at most); accepted: " +
                                     form + " with each field in [1, 2^31 - 1]");
      ++n;
    }
    require(n >= 3, "--shapes: '" + item + "' needs " + form);
    // fields the op would ignore are refused, not dropped silently
    require(op != "attn-res" || n == 3, "--shapes: '" + item + "' has " + std::to_string(n) +
                                            " fields; attn-res shapes are S:T:d (sources, tokens, width), 3 fields");
    if (n == 3) v[3] = v[2];
    require(v[0] >= 1 && v[1] >= 1 && v[2] >= 1 && v[3] >= v[2] && v[3] % v[2] == 0,
            "--shapes: '" + item + "' must have B, T, H >= 1 and HV a multiple of H");
    require((op != "mla-decode" && op != "mla-prefill") || v[3] == v[2],
            "--shapes: '" + item + "' has HV = " + std::to_string(v[3]) + " != H = " + std::to_string(v[2]) + "; " + op +
                " shapes are " + form + " (one latent cache shared by every head: no HV)");
    require(op != "kda-decode" || v[1] == 1, "--shapes: decode shapes have T = 1, got '" + item + "'");
    require(v[4] == 64 || v[4] == 128 || v[4] == 256,
            "--shapes: D = " + std::to_string(v[4]) + " in '" + item + "'; accepted: D = 64, 128 or 256");
    Shape s{v[0], v[1], v[2], v[3], v[4]};
    if (own >= 0) {
      require(own <= kMaxField - s.T, "--shapes: '" + item + "' has N0 + T = " + std::to_string(own + s.T) +
                                          ", above 2^31 - 1; accepted: B:T:H+N0 with N0 >= 0 cached tokens and N0 + T "
                                          "<= 2^31 - 1 (2147483647)");
      s.N0 = own;
    } else if (op == "mla-prefill") {
      s = with_prefix(s);
    }
    // mla-prefill: "1:64:2" with --prefix 16 is the row of "1:64:2+16"
    require_once(std::find(r.begin(), r.end(), s) == r.end(), "--shapes",
                 "'" + item + "'" + (op == "mla-prefill" ? " (N0 = " + std::to_string(s.N0) + ")" : std::string()));
    r.push_back(s);
  }
  require(!r.empty(), "--shapes is empty");
  return r;
}

/// The rows of one --compare file: per bench group ("kda_prefill", ...) the `key` and `time_ms` columns.
struct BaselineRows {
  std::map<std::string, std::pair<std::vector<std::string>, std::vector<double>>> groups;
};

/// What bench's check planned for its run: the ops timed (--op all: each), their shapes (mla-prefill: each shape
/// three times, absorbed, naive, fast), the merged --peer-json times, the HDF5 group names of the ops (bench/kda_prefill:
/// "kda_prefill") and the --compare files, each read completely.
struct BenchPlan {
  std::vector<std::string> ops;
  std::vector<std::vector<Shape>> shapes;
  nlohmann::json peer;
  std::vector<std::string> grps;
  std::vector<BaselineRows> baselines;
};

/// The note added to "'<item>' does not exist" for `items[i]`, an item of the comma-split list option `option`
/// (CLI11 splits its values at ','), when some run of neighbouring items around it, joined again at commas, names an
/// existing file: "a,b.h5" was read as 'a' and 'b.h5'. "" when no such run names a file (or the item exists).
std::string comma_split_note(const std::string& option, const std::vector<std::string>& items, std::size_t i) {
  std::error_code ec;
  for (std::size_t first = 0; first <= i; ++first)
    for (std::size_t last = std::max(i, first + 1); last < items.size(); ++last) {  // two items or more, with item i
      std::string joined = items[first];
      for (std::size_t k = first + 1; k <= last; ++k) joined += "," + items[k];
      if (std::filesystem::exists(joined, ec))
        return "; the value was split at its commas (" + option + " is a comma-separated list) and '" + joined +
               "' is a file: a file name containing a comma cannot be given to " + option +
               " (rename it, or give a link to it without a comma)";
    }
  return "";
}

/// Reads a --compare file completely, before any GPU work: /bench must be a group; each group /bench/<grp> of
/// `grps` (the ops bench will time, '-' as '_') that the file has must be a group with a 1-D string dataset `key`
/// and a 1-D numeric dataset `time_ms` of the same length, every time finite and > 0. A group the file lacks is
/// skipped (its rows have no baseline). Errors: kdalab::Error naming --compare, the file and what is wrong (exit
/// 2); an HDF5 library failure (H5::Exception, not a std::exception) becomes a kdalab::Error too.
/// `split_note`: comma_split_note() for cf, added to the "does not exist" message.
BaselineRows read_compare_file(const std::string& cf, const std::vector<std::string>& grps,
                               const std::string& split_note = "") {
  const std::string what = "--compare: '" + cf + "'";
  const std::string give = "; give a kdalab bench results file (e.g. data/baselines/h200.h5)";
  std::error_code ec;
  require(!std::filesystem::is_directory(cf, ec), what + " is a directory" + give);
  require(std::filesystem::is_regular_file(cf, ec), what + " does not exist or is not a file" + give + split_note);
  H5::Exception::dontPrint();
  BaselineRows r;
  try {
    H5::H5File f(cf, H5F_ACC_RDONLY);
    require(f.nameExists("bench"), what + " has no group /bench" + give);
    require(f.childObjType("bench") == H5O_TYPE_GROUP, what + ": /bench is not a group" + give);
    H5::Group b = f.openGroup("bench");
    for (const std::string& grp : grps) {
      if (!b.nameExists(grp)) continue;  // e.g. no MLA rows in a KDA baseline: those rows have no baseline
      const std::string where = what + ": /bench/" + grp;
      require(b.childObjType(grp) == H5O_TYPE_GROUP, where + " is not a group (a table with 'key' and 'time_ms')" + give);
      H5::Group g = b.openGroup(grp);
      for (const char* col : {"key", "time_ms"})
        require(g.nameExists(col) && g.childObjType(col) == H5O_TYPE_DATASET,
                where + " has no dataset '" + col + "'" + give);
      H5::DataSet kd = g.openDataSet("key"), td = g.openDataSet("time_ms");
      require(kd.getTypeClass() == H5T_STRING, where + "/key is not a string dataset (the row keys)" + give);
      require(td.getTypeClass() == H5T_FLOAT || td.getTypeClass() == H5T_INTEGER,
              where + "/time_ms is not a numeric dataset (milliseconds)" + give);
      H5::DataSpace ks = kd.getSpace(), ts = td.getSpace();
      require(ks.getSimpleExtentNdims() == 1, where + "/key is not 1-D" + give);
      require(ts.getSimpleExtentNdims() == 1, where + "/time_ms is not 1-D" + give);
      hsize_t nk = 0, nt = 0;
      ks.getSimpleExtentDims(&nk);
      ts.getSimpleExtentDims(&nt);
      require(nk == nt, where + ": 'key' has " + std::to_string(nk) + " rows and 'time_ms' " + std::to_string(nt) +
                            "; accepted: columns of the same length" + give);
      std::vector<std::string> keys = h5read::strings(cf, "bench/" + grp + "/key");  // variable or fixed length
      const std::vector<double> ms = h5read::array(cf, "bench/" + grp + "/time_ms").data;
      for (hsize_t i = 0; i < nt; ++i)
        require(std::isfinite(ms[i]) && ms[i] > 0,
                where + "/time_ms row " + std::to_string(i) + " ('" + keys[i] + "') = " + fmt::format("{}", ms[i]) +
                    "; accepted: a time in milliseconds, finite and > 0" + give);
      r.groups[grp] = {std::move(keys), ms};
    }
  } catch (const H5::Exception& e) {
    throw Error(what + " is not a readable HDF5 bench file (" + e.getDetailMsg() + ")" + give);
  }
  return r;
}

/// The row key (the table's first column, the --compare and --peer-json key). mla-prefill rows with a cached prefix
/// end in " N0=<N0>" (from the shape's +N0 or --prefix alike); rows without one keep the key they always had.
[[maybe_unused]] std::string key_of(const std::string& op, const Shape& s) {
  if (op == "mla-prefill" && s.naive) {  // the naive and fast rows beside the absorbed one (whose key is unchanged)
    const char* row = s.fast ? "fast" : "naive";
    if (s.N0 > 0) return fmt::format("{}-{} B={} T={} H={} HV={} N0={}", op, row, s.B, s.T, s.H, s.HV, s.N0);
    return fmt::format("{}-{} B={} T={} H={} HV={}", op, row, s.B, s.T, s.H, s.HV);
  }
  if (op == "mla-prefill" && s.N0 > 0) return fmt::format("{} B={} T={} H={} HV={} N0={}", op, s.B, s.T, s.H, s.HV, s.N0);
  if (op == "attn-res") return fmt::format("{} S={} T={} d={}", op, s.B, s.T, s.H);
  if (s.D != 128) return fmt::format("{} B={} T={} H={} HV={} D={}", op, s.B, s.T, s.H, s.HV, s.D);
  return fmt::format("{} B={} T={} H={} HV={}", op, s.B, s.T, s.H, s.HV);
}

#ifdef KDALAB_HAVE_CUDA
using kernels::bf16_t;
using kernels::cuda_check;

struct Dev {
  void* p = nullptr;
  std::size_t bytes = 0;  // as asked (cudaMalloc gets at least 16)
  /// Device buffer of n bytes. Errors: a shape too large for the device's memory -> kdalab::Error (exit 2) saying how
  /// much was asked and how much is free; any other CUDA error as cuda_check.
  explicit Dev(std::size_t n) : bytes(n) {
    const cudaError_t e = cudaMalloc(&p, std::max<std::size_t>(n, 16));
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // an allocation failure is not sticky: clear it, the context stays usable
      std::size_t free_b = 0, total_b = 0;
      (void)cudaMemGetInfo(&free_b, &total_b);
      throw Error(fmt::format("not enough GPU memory for this shape: a buffer of {:.2f} GiB was asked for, {:.2f} GiB of "
                              "{:.2f} GiB are free; choose smaller --shapes (or --prefix); nothing was written",
                              n / 1073741824.0, free_b / 1073741824.0, total_b / 1073741824.0));
    }
    cuda_check(e, "cudaMalloc");
  }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  template <class T> T* as() const { return static_cast<T*>(p); }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class F>
std::pair<double, double> time_ms(F&& launch, int warmup, int iters) {
  cudaEvent_t a, b;
  cuda_check(cudaEventCreate(&a), "event");
  cuda_check(cudaEventCreate(&b), "event");
  for (int i = 0; i < warmup; ++i) launch();
  cuda_check(cudaDeviceSynchronize(), "warm-up");
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    cuda_check(cudaEventRecord(a, nullptr), "record");
    launch();
    cuda_check(cudaEventRecord(b, nullptr), "record");
    cuda_check(cudaEventSynchronize(b), "sync");
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, a, b), "elapsed");
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return {median(t), *std::min_element(t.begin(), t.end())};
}

/// Median and minimum time per step (ms) of `steps` launches captured into one CUDA graph (a decode loop
/// as an inference engine runs it: no host launch gap between steps). step(stream) enqueues one step.
template <class F>
std::pair<double, double> graph_step_ms(F&& step, int steps, int warmup, int iters) {
  cudaStream_t st;
  cuda_check(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
  cudaGraph_t gr;
  cudaGraphExec_t ge;
  cuda_check(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal), "capture");
  for (int i = 0; i < steps; ++i) step(st);
  cuda_check(cudaStreamEndCapture(st, &gr), "end capture");
  cuda_check(cudaGraphInstantiate(&ge, gr, 0), "instantiate");
  auto [ms, mn] = time_ms([&] { cuda_check(cudaGraphLaunch(ge, nullptr), "graph launch"); }, warmup, iters);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(gr);
  cudaStreamDestroy(st);
  return {ms / steps, mn / steps};
}

double copy_ceiling_tbs() {
  const std::size_t n = std::size_t{1} << 30;
  Dev x(n), y(n);
  cuda_check(cudaMemset(x.p, 1, n), "memset");
  auto [ms, mn] = time_ms([&] { cuda_check(cudaMemcpyAsync(y.p, x.p, n, cudaMemcpyDeviceToDevice, nullptr), "copy"); }, 3, 15);
  (void)mn;
  return 2.0 * n / (ms * 1e-3) / 1e12;
}

struct Measured {
  double ms, ms_min, bytes, flops, prepare_ms = 0, state_ms = 0;
  double graph_ms = std::numeric_limits<double>::quiet_NaN();  // MLA decode, B <= 8: per step in a graph of 20 steps
  double floor_ms = std::numeric_limits<double>::quiet_NaN();  // the same bytes read by a plain kernel, same graph
  // kda-backward: the forward and the backward each timed alone (medians), the backward's own bytes and flops model,
  // and the device bytes allocated (inputs, outputs, both workspaces)
  double fwd_ms = std::numeric_limits<double>::quiet_NaN(), bwd_ms = std::numeric_limits<double>::quiet_NaN();
  double bwd_bytes = std::numeric_limits<double>::quiet_NaN(), bwd_flops = std::numeric_limits<double>::quiet_NaN();
  double peak_bytes = std::numeric_limits<double>::quiet_NaN();
};

/// The least bytes and the FLOPs of a KDA prefill of shape s (chunk 16, D = s.D) with its timings.
Measured prefill_measured(const Shape& s, double ms, double mn, double prep, double state) {
  const double D = static_cast<double>(s.D), Cc = 16;
  const double nq = double(s.B) * s.T * s.H * D, nv = double(s.B) * s.T * s.HV * D;
  const double chunks = static_cast<double>(s.B) * ((s.T + 15) / 16) * s.HV;  // integer ceil(T / 16)
  const double flops = chunks * (4.0 * Cc * Cc * D + 2.0 * Cc * Cc * D + 6.0 * Cc * D * D + 2.0 * Cc * Cc * D);
  const double bytes = 2.0 * (2.0 * nq + 3.0 * nv + double(s.B) * s.T * s.HV) + 2.0 * 4.0 * s.B * s.HV * D * D;
  return {ms, mn, bytes, flops, prep, state};
}

/// The kda-prefill overrides of the options: --state-pass (checked: one of the four names) and --segments.
kernels::KdaPrefillOverrides prefill_overrides(const std::string& state_pass, int segments) {
  kernels::KdaPrefillOverrides ov;
  ov.state_pass = state_pass == "mma"         ? kernels::KdaStatePass::mma
                  : state_pass == "wgmma"     ? kernels::KdaStatePass::wgmma
                  : state_pass == "key-split" ? kernels::KdaStatePass::key_split
                                              : kernels::KdaStatePass::automatic;
  ov.schedule = segments == 0 ? kernels::KdaSchedule::automatic
                : segments == 1 ? kernels::KdaSchedule::one_shot
                                : kernels::KdaSchedule::segments;
  ov.segments = segments >= 2 ? segments : 0;
  return ov;
}

/// The device tensors of a KDA prefill of shape s as the bench draws them, and the KdaPrefillArgs over them (no
/// workspace): q, k [B, T, H, D], v, g (raw gate logits) [B, T, HV, D], beta (raw logits) [B, T, HV] seeded N(0,1)
/// bf16 fills (seeds seed + 1 .. seed + 5); A_log [HV], bias [HV, D] U(0,1) fp32 (seed + 6, + 7); S0 [B, HV, D, D]
/// 0.1 N(0,1) fp32 (seed + 8); outputs o [B, T, HV, D] bf16 and S_final [B, HV, D, D] fp32. The K3 gate (g_min = -5),
/// the L2Norm of q, k and the beta sigmoid in the kernel; scale = D^-1/2. Shared by kda-prefill and kda-backward.
struct PrefillInputs {
  std::size_t nq, nv, nb, ns;  // elements of q (and k), v (and g, o), beta, S0 (and S_final)
  Dev q, k, v, g, beta, o, A_log, bias, S0, Sf;
  kernels::KdaPrefillArgs a;
  PrefillInputs(const Shape& s, std::uint64_t seed)
      : nq(s.B * s.T * s.H * s.D), nv(s.B * s.T * s.HV * s.D), nb(s.B * s.T * s.HV), ns(s.B * s.HV * s.D * s.D),
        q(nq * 2), k(nq * 2), v(nv * 2), g(nv * 2), beta(nb * 2), o(nv * 2), A_log(s.HV * 4), bias(s.HV * s.D * 4),
        S0(ns * 4), Sf(ns * 4) {
    const long long D = s.D;
    kernels::fill_normal_bf16(q.as<bf16_t>(), nq, seed + 1, 1.0f, nullptr);
    kernels::fill_normal_bf16(k.as<bf16_t>(), nq, seed + 2, 1.0f, nullptr);
    kernels::fill_normal_bf16(v.as<bf16_t>(), nv, seed + 3, 1.0f, nullptr);
    kernels::fill_normal_bf16(g.as<bf16_t>(), nv, seed + 4, 1.0f, nullptr);
    kernels::fill_normal_bf16(beta.as<bf16_t>(), nb, seed + 5, 1.0f, nullptr);
    kernels::fill_uniform_f32(A_log.as<float>(), s.HV, seed + 6, nullptr);
    kernels::fill_uniform_f32(bias.as<float>(), s.HV * D, seed + 7, nullptr);
    kernels::fill_normal_f32(S0.as<float>(), ns, seed + 8, 0.1f, nullptr);
    a.B = static_cast<int>(s.B); a.T = static_cast<int>(s.T); a.H = static_cast<int>(s.H); a.HV = static_cast<int>(s.HV);
    a.D = static_cast<int>(D);
    a.q = q.as<bf16_t>(); a.k = k.as<bf16_t>(); a.v = v.as<bf16_t>(); a.g = g.as<bf16_t>(); a.beta = beta.as<bf16_t>();
    a.gate.A_log = A_log.as<float>(); a.gate.bias = bias.as<float>(); a.gate.g_min = -5.0f;
    a.scale = 1.0f / std::sqrt(static_cast<float>(D));
    a.S0 = S0.as<float>(); a.S_final = Sf.as<float>(); a.o = o.as<bf16_t>();
  }
  /// Bytes of the buffers above (as asked of cudaMalloc).
  std::size_t bytes() const {
    std::size_t n = 0;
    for (const Dev* d : {&q, &k, &v, &g, &beta, &o, &A_log, &bias, &S0, &Sf}) n += d->bytes;
    return n;
  }
};

Measured bench_prefill(const Shape& s, int warmup, int iters, std::uint64_t seed, kernels::KdaPrefillOverrides ov,
                       bool single_stream, bool accurate) {
  PrefillInputs in(s, seed);
  kernels::KdaPrefillArgs& a = in.a;
  a.single_stream = single_stream;
  a.precision = accurate ? kernels::KdaPrecision::accurate : kernels::KdaPrecision::fast;
  const std::size_t wsb = kernels::kda_prefill_workspace_bytes(a, &ov);
  Dev ws(wsb);
  a.workspace = ws.p; a.workspace_bytes = wsb;
  auto [ms, mn] = time_ms([&] { kernels::kda_prefill(a, nullptr, &ov); }, warmup, iters);
  ov.phases = kernels::KdaPhases::prepare;
  const double prep = time_ms([&] { kernels::kda_prefill(a, nullptr, &ov); }, warmup, iters).first;
  ov.phases = kernels::KdaPhases::state;
  const double state = time_ms([&] { kernels::kda_prefill(a, nullptr, &ov); }, warmup, iters).first;
  return prefill_measured(s, ms, mn, prep, state);
}

/// The model of the KDA backward (kernels/kda_backward.hpp, version 1) for a fixed-length batch of shape s with the
/// fused K3 gate (docs/kernels/kda_backward.md, "Measuring"). M = B T token rows, P = D / NC column blocks per value
/// head (NC = 64; 32 at D = 256). Returns {bytes, flops}:
///  bytes: the compulsory traffic. Inputs read once (q, k, v, g, dO, beta bf16; A_log, bias, S0, dS_T fp32), outputs
///    written once (dq, dk, dv, dg, dbeta bf16; dA_log, dbias, dS0 fp32), and each workspace region written once and
///    read once, fp32: the prepared inputs M (2 H D + 2 H + HV D + HV), the checkpoints B ceil(T / 64) HV D^2, the
///    partials P M HV (3 D + 1) + M HV and the per-token dbias terms M HV D (the epilogue writes them over partial
///    slot 0, the params kernel reads them). Not counted: the sweep's per-CTA scratch (each sub-chunk's states, a
///    D x NC tile written and read back per token, mostly from L2) and the repeated reads of the prepared inputs by
///    the three passes of the sweep.
///  flops: the sweep's fp32 work on the state, per value head and step on its D^2 elements, an FMA counted as 2
///    (kernels/kda_backward/sweep.cu): a forward step 5 (S' = Diag(a) S; u += k S'; S += k (beta (v - u))), a reverse
///    step 23 (bwd_step: u = S'^T k and G^T k, 7; then S', S_t, dq, G, G delta, S' G^T k, dS', dg, Diag(a) dS', 16).
///    A sequence of L tokens, n = ceil(L / 64) chunks, l = L - 64 (n - 1) tokens in the last one, takes L reverse
///    steps and 64 (n - 1) (the checkpoint sweep) + 56 (n - 1) + 8 (ceil(l / 8) - 1) (the sub-checkpoints) +
///    L - 8 (n - 1) - ceil(l / 8) (each sub-chunk's states) forward steps, about 2.75 L. Not counted: the warp
///    butterflies (every lane adds the same sums), the per-row and per-column terms (O(D) per warp and step), the
///    prepare, the epilogue and the params sums (O(D) per token and head): the useful work on the state, ~20% below
///    the executed fp32 operations at D = 128.
std::pair<double, double> backward_model(const Shape& s) {
  const double D = static_cast<double>(s.D), H = static_cast<double>(s.H), HV = static_cast<double>(s.HV);
  const double M = static_cast<double>(s.B) * s.T, P = s.D == 256 ? 8.0 : s.D / 64.0;
  const double nq = M * H * D, nv = M * HV * D, nb = M * HV, ns = static_cast<double>(s.B) * HV * D * D;
  const long long n = (s.T + 63) / 64, l = s.T - 64 * (n - 1), lsub = (l + 7) / 8;
  const double in = 2.0 * (2.0 * nq + 3.0 * nv + nb) + 4.0 * (HV + HV * D) + 4.0 * 2.0 * ns;
  const double out = 2.0 * (2.0 * nq + 2.0 * nv + nb) + 4.0 * (HV + HV * D) + 4.0 * ns;
  const double ws = M * (2.0 * H * D + 2.0 * H + HV * D + HV) + static_cast<double>(s.B) * n * HV * D * D +
                    P * M * HV * (3.0 * D + 1.0) + M * HV + M * HV * D;
  const double fwd_steps = 64.0 * (n - 1) + 56.0 * (n - 1) + 8.0 * (lsub - 1) + (s.T - 8.0 * (n - 1) - lsub);
  const double steps = static_cast<double>(s.B) * HV * (5.0 * fwd_steps + 23.0 * s.T);
  return {in + out + 2.0 * 4.0 * ws, steps * D * D};
}

/// The chunked pass's model (kernels/kda_backward/chunked.cu), per sequence of L tokens in J = ceil(L / 16) chunks:
///  bytes: the inputs and outputs as backward_model; the workspace regions written once and read once (the prepared
///    inputs, the partials, every chunk's S and dS), the factor slots (W, U, Kd, Qg, gamL, B, P, N) written once and
///    read three times (the two chains and the gradient kernel), and the prepared gate read again by the gradient
///    kernel (it re-forms Gam, Kg and Ki).
///  flops: the fp32-class products of a chunk as executed, per value head, an FMA counted as 2 (the three tf32
///    passes of a product counted once): the chains 2 C D^2 (V~ = U - W S, Kd^T V~) and 3 C D^2 + C^2 D (Kd dS,
///    Qg^T dO, W^T dV~, P^T dO); the gradient kernel 5 C D^2 (W S, Kd dS, dO S^T, dV~ S^T, V~ dS^T) + 4 C^2 D
///    (P^T dO, N^T dV~, dO V~^T, dY U^T) + 7 C^2 D (N^T dW, dX W^T, dP Ki, dP^T Qg, dB^T Kg, dB Ki, ...); the factors
///    C^2 D (B and P, lower halves) + C^2 (2 D + C) / 2 (the substitution). C = 16.
std::pair<double, double> chunked_backward_model(const Shape& s) {
  const double D = static_cast<double>(s.D), H = static_cast<double>(s.H), HV = static_cast<double>(s.HV);
  const double M = static_cast<double>(s.B) * s.T, C = 16.0;
  const double J = static_cast<double>(s.B) * static_cast<double>((s.T + 15) / 16);
  const double nq = M * H * D, nv = M * HV * D, nb = M * HV, ns = static_cast<double>(s.B) * HV * D * D;
  const double in = 2.0 * (2.0 * nq + 3.0 * nv + nb) + 4.0 * (HV + HV * D) + 4.0 * 2.0 * ns;
  const double out = 2.0 * (2.0 * nq + 2.0 * nv + nb) + 4.0 * (HV + HV * D) + 4.0 * ns;
  const double fac = J * HV * (4.0 * C * D + D + 3.0 * C * C);
  // the partials: dq, dk, dg and dbeta for the epilogue kernel, and dg_raw for the params sums; with HV = H the
  // gradient kernel applies the chain rules itself and only dg_raw is kept
  const double part = HV == H ? M * HV * D : M * HV * (3.0 * D + 1.0) + M * HV * D;
  const double ws = M * (2.0 * H * D + 2.0 * H + HV * D + HV) + 2.0 * J * HV * D * D + part + M * HV;
  const double fma = J * HV * (10.0 * C * D * D + 13.0 * C * C * D + C * C * (2.0 * D + C) / 2.0);
  return {in + out + 2.0 * 4.0 * ws + 4.0 * 4.0 * fac + 4.0 * M * HV * D, 2.0 * fma};
}

/// kda-backward: the forward (kda_prefill with S_final, the rule's plan) and the backward (kda_backward) of the KDA
/// prefill on bench_prefill's inputs (PrefillInputs: the fused K3 gate, L2Norm and beta sigmoid, S0 given) with the
/// upstream dO [B, T, HV, D] N(0,1) bf16 (seed + 9) and dS_T [B, HV, D, D] N(0,1) fp32 (seed + 10). Times (CUDA
/// events, --warmup then --iters launches each, as bench_prefill): the forward alone, the backward alone and the
/// forward then the backward; the row's time is the last. Bytes and flops: the prefill's model plus backward_model.
Measured bench_backward(const Shape& s, int warmup, int iters, std::uint64_t seed, const std::string& pass_name) {
  kernels::KdaBackwardOverrides ov;
  ov.pass = pass_name == "sweep"        ? kernels::KdaBackwardPass::sweep
            : pass_name == "chunked"    ? kernels::KdaBackwardPass::chunked
            : pass_name == "chunked_wg" ? kernels::KdaBackwardPass::chunked_wg
                                        : kernels::KdaBackwardPass::automatic;
  PrefillInputs in(s, seed);
  const std::size_t nq = in.nq, nv = in.nv, nb = in.nb, ns = in.ns;
  Dev dO(nv * 2), dST(ns * 4), dq(nq * 2), dk(nq * 2), dv(nv * 2), dg(nv * 2), dbeta(nb * 2), dA(s.HV * 4),
      dbias(s.HV * s.D * 4), dS0(ns * 4);
  kernels::fill_normal_bf16(dO.as<bf16_t>(), nv, seed + 9, 1.0f, nullptr);
  kernels::fill_normal_f32(dST.as<float>(), ns, seed + 10, 1.0f, nullptr);
  const kernels::KdaPrefillArgs& f = in.a;
  kernels::KdaBackwardArgs b;
  b.B = f.B; b.T = f.T; b.H = f.H; b.HV = f.HV; b.D = f.D;
  b.q = f.q; b.k = f.k; b.v = f.v; b.g = f.g; b.beta = f.beta;
  b.gate = f.gate; b.scale = f.scale; b.l2norm_qk = f.l2norm_qk; b.beta_sigmoid = f.beta_sigmoid;
  b.S0 = f.S0;
  b.dO = dO.as<bf16_t>(); b.dS_T = dST.as<float>();
  b.dq = dq.as<bf16_t>(); b.dk = dk.as<bf16_t>(); b.dv = dv.as<bf16_t>(); b.dg = dg.as<bf16_t>();
  b.dbeta = dbeta.as<bf16_t>(); b.dA_log = dA.as<float>(); b.dbias = dbias.as<float>(); b.dS0 = dS0.as<float>();
  const std::size_t wsf = kernels::kda_prefill_workspace_bytes(in.a), wsb = kernels::kda_backward_workspace_bytes(b, &ov);
  Dev wf(wsf), wb(wsb);
  in.a.workspace = wf.p; in.a.workspace_bytes = wsf;
  b.workspace = wb.p; b.workspace_bytes = wsb;
  std::size_t inputs = in.bytes() - in.o.bytes - in.Sf.bytes + dO.bytes + dST.bytes, outputs = in.o.bytes + in.Sf.bytes;
  for (const Dev* d : {&dq, &dk, &dv, &dg, &dbeta, &dA, &dbias, &dS0}) outputs += d->bytes;
  const double fwd = time_ms([&] { kernels::kda_prefill(in.a, nullptr); }, warmup, iters).first;
  const double bwd = time_ms([&] { kernels::kda_backward(b, nullptr, &ov); }, warmup, iters).first;
  // the row's time: forward then backward per call of a CUDA graph, as the peer's harness times fla (no host launch
  // gaps on either side); the same two calls as eager launches are printed beside it
  auto [ms, mn] = graph_step_ms([&](cudaStream_t st) {
    kernels::kda_prefill(in.a, st);
    kernels::kda_backward(b, st, &ov);
  }, 1, warmup, iters);
  const double eager = time_ms([&] {
    kernels::kda_prefill(in.a, nullptr);
    kernels::kda_backward(b, nullptr, &ov);
  }, warmup, iters).first;
  Measured m = prefill_measured(s, ms, mn, 0.0, 0.0);
  const kernels::KdaBackwardPass ran = kernels::kda_backward_plan(b, &ov);
  const bool chunked = ran == kernels::KdaBackwardPass::chunked || ran == kernels::KdaBackwardPass::chunked_wg;
  {  // the backward's phases: each prefix of its launches timed, the differences printed
    using Ph = kernels::KdaBackwardPhase;
    const std::vector<std::pair<Ph, const char*>> phases =
        chunked ? std::vector<std::pair<Ph, const char*>>{{Ph::prepare, "prepare"}, {Ph::factors, "factors"},
                                                          {Ph::forward_chain, "forward chain"},
                                                          {Ph::reverse_chain, "reverse chain"},
                                                          {Ph::gradients, "gradients"},
                                                          // HV = H: the gradient kernel applies the chain rules
                                                          {Ph::all, s.HV == s.H ? "params" : "epilogue"}}
                : std::vector<std::pair<Ph, const char*>>{{Ph::prepare, "prepare"}, {Ph::gradients, "sweep"},
                                                          {Ph::all, "epilogue"}};
    std::string line;
    double before = 0.0;
    for (const auto& [ph, name] : phases) {
      kernels::KdaBackwardOverrides o = ov;
      o.last = ph;
      const double t = ph == Ph::all ? bwd : time_ms([&] { kernels::kda_backward(b, nullptr, &o); }, warmup, iters).first;
      line += fmt::format("{}{} {:.3f}", line.empty() ? "" : ", ", name, t - before);
      before = t;
    }
    fmt::print("  (backward phases, ms, each prefix of launches timed: {})\n", line);
  }
  const auto [bb, bf] = chunked ? chunked_backward_model(s) : backward_model(s);
  m.bytes += bb;
  m.flops += bf;
  m.fwd_ms = fwd;
  m.bwd_ms = bwd;
  m.bwd_bytes = bb;
  m.bwd_flops = bf;
  m.peak_bytes = static_cast<double>(inputs + outputs + wsf + wsb);
  std::size_t free_b = 0, total_b = 0;
  cuda_check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  fmt::print("  (B={} T={} H={} HV={} D={}: forward {:.4f} ms, backward {:.4f} ms ({:.2f} TB/s, {:.1f} TFLOP/s of its "
             "model: {:.2f} GB, {:.1f} GFLOP), forward + backward {:.4f} ms in a CUDA graph ({:.4f} eager); device memory {:.2f} GB = inputs {:.2f} + "
             "outputs {:.2f} + prefill workspace {:.2f} + backward workspace {:.2f} GB ({:.2f} of {:.2f} GB in use on "
             "the device))\n",
             s.B, s.T, s.H, s.HV, s.D, fwd, bwd, bb / (bwd * 1e-3) / 1e12, bf / (bwd * 1e-3) / 1e12, bb / 1e9, bf / 1e9, ms, eager,
             m.peak_bytes / 1e9, inputs / 1e9, outputs / 1e9, wsf / 1e9, wsb / 1e9, (total_b - free_b) / 1e9,
             total_b / 1e9);
  return m;
}

Measured bench_decode(const Shape& s, int warmup, int iters, std::uint64_t seed) {
  const long long D = s.D;
  const std::size_t nq = s.B * s.H * D, nv = s.B * s.HV * D, ns = s.B * s.HV * D * D;
  Dev q(nq * 2), k(nq * 2), v(nv * 2), g(nv * 2), beta(s.B * s.HV * 2), o(nv * 2);
  Dev A_log(s.HV * 4), bias(s.HV * D * 4), S(ns * 4);
  kernels::fill_normal_bf16(q.as<bf16_t>(), nq, seed + 1, 1.0f, nullptr);
  kernels::fill_normal_bf16(k.as<bf16_t>(), nq, seed + 2, 1.0f, nullptr);
  kernels::fill_normal_bf16(v.as<bf16_t>(), nv, seed + 3, 1.0f, nullptr);
  kernels::fill_normal_bf16(g.as<bf16_t>(), nv, seed + 4, 1.0f, nullptr);
  kernels::fill_normal_bf16(beta.as<bf16_t>(), s.B * s.HV, seed + 5, 1.0f, nullptr);
  kernels::fill_uniform_f32(A_log.as<float>(), s.HV, seed + 6, nullptr);
  kernels::fill_uniform_f32(bias.as<float>(), s.HV * D, seed + 7, nullptr);
  kernels::fill_normal_f32(S.as<float>(), ns, seed + 8, 0.1f, nullptr);
  kernels::KdaDecodeArgs a;
  a.B = static_cast<int>(s.B); a.H = static_cast<int>(s.H); a.HV = static_cast<int>(s.HV);
  a.D = static_cast<int>(D);
  a.q = q.as<bf16_t>(); a.k = k.as<bf16_t>(); a.v = v.as<bf16_t>(); a.g = g.as<bf16_t>(); a.beta = beta.as<bf16_t>();
  a.gate.A_log = A_log.as<float>(); a.gate.bias = bias.as<float>(); a.gate.g_min = -5.0f;
  a.scale = 1.0f / std::sqrt(static_cast<float>(D));
  a.state = S.as<float>(); a.o = o.as<bf16_t>();
  const double bytes = 2.0 * 4.0 * ns + 2.0 * (2.0 * nq + 3.0 * nv + s.B * s.HV);
  const double flops = 7.0 * s.B * s.HV * D * D;
  if (s.B > 8) {
    auto [ms, mn] = time_ms([&] { kernels::kda_decode(a, nullptr); }, warmup, iters);
    return {ms, mn, bytes, flops};
  }
  // small batch: one CUDA graph of 100 steps, per-step time
  auto [ms, mn] = graph_step_ms([&](cudaStream_t st) { kernels::kda_decode(a, st); }, 100, warmup, iters);
  return {ms, mn, bytes, flops};
}

/// The --mla-precision value as the kernel's precision: "auto", "accurate" or "fast" (checked before).
kernels::MlaDecodePrecision mla_precision_of(const std::string& name) {
  return name == "accurate" ? kernels::MlaDecodePrecision::accurate
         : name == "fast"   ? kernels::MlaDecodePrecision::fast
                            : kernels::MlaDecodePrecision::automatic;
}

/// The key suffix of an mla-decode row: " s_q=<s_q>" for s_q > 1, then " fast" or " accurate" when --mla-precision
/// names another precision than the rule's for s_q (kernels/mla.hpp mla_decode_precision_rule); "" for the one-token
/// step in its automatic precision (the keys of every earlier baseline).
std::string mla_decode_suffix(int s_q, const std::string& precision, bool with_precision) {
  std::string r = s_q > 1 ? " s_q=" + std::to_string(s_q) : "";
  const std::string rule = kernels::mla_decode_precision_name(kernels::mla_decode_precision_rule(s_q));
  if (with_precision && precision != "auto" && precision != rule) r += " " + precision;
  return r;
}

/// Absorbed MLA decode: B sequences of T cached tokens (the shape's T is the context N), H heads, s_q query tokens per
/// sequence in the precision `prec` (the fast precision reads q_hi alone).
Measured bench_mla_decode(const Shape& s, int s_q, kernels::MlaDecodePrecision prec, int splits, int warmup,
                          int iters, std::uint64_t seed) {
  const long long DC = 512;
  const std::size_t nc = static_cast<std::size_t>(s.B) * s.T * DC, nq = static_cast<std::size_t>(s.B) * s_q * s.H * DC;
  Dev c(nc * 2), q_hi(nq * 2), q_lo(nq * 2), out(nq * 4);
  kernels::fill_normal_bf16(c.as<bf16_t>(), nc, seed + 1, 1.0f, nullptr);
  kernels::fill_normal_bf16(q_hi.as<bf16_t>(), nq, seed + 2, 1.2f, nullptr);
  kernels::fill_normal_bf16(q_lo.as<bf16_t>(), nq, seed + 3, 1.2f / 512.0f, nullptr);
  kernels::MlaDecodeArgs a;
  a.B = static_cast<int>(s.B); a.H = static_cast<int>(s.H);
  a.capacity = static_cast<int>(s.T); a.max_len = static_cast<int>(s.T);
  a.s_q = s_q; a.precision = prec;
  a.c = c.as<bf16_t>(); a.q_hi = q_hi.as<bf16_t>(); a.q_lo = q_lo.as<bf16_t>();
  a.scale = 1.0f / std::sqrt(192.0f);
  a.out = out.as<float>();
  kernels::MlaDecodeOverrides ov;
  ov.num_splits = splits;  // 0: the plan's choice
  const auto pl = kernels::mla_decode_plan(a, &ov);
  if (pl.precision == kernels::MlaDecodePrecision::fast) a.q_lo = nullptr;  // fast reads the bf16 query alone
  const std::size_t wsb = kernels::mla_decode_workspace_bytes(a, &ov);
  Dev ws(wsb);
  a.workspace = ws.p; a.workspace_bytes = wsb;
  auto [ms, mn] = time_ms([&] { kernels::mla_decode(a, nullptr, &ov); }, warmup, iters);
  fmt::print("  (B={} N={} H={} s_q={}: {} precision, {} splits of {} tokens x {} row group{}, {} output, workspace "
             "{:.1f} MB)\n", s.B, s.T, s.H, s_q, kernels::mla_decode_precision_name(pl.precision), pl.num_splits,
             pl.split_len, pl.row_groups, pl.row_groups > 1 ? "s" : "", kernels::mla_decode_output_name(pl.output),
             wsb / 1e6);
  Measured m{ms, mn, 2.0 * nc, 4.0 * s.B * s.H * s.T * DC * s_q};
  if (s.B <= 8) {  // a decode loop runs in a graph: the per-step time without the host launch gap (printed beside)
    m.graph_ms =
        graph_step_ms([&](cudaStream_t st) { kernels::mla_decode(a, st, &ov); }, 20, 2, std::max(3, iters / 5)).first;
    fmt::print("  (B={} N={} H={} s_q={}: in a CUDA graph of 20 steps {:.1f} us per step, {:.2f} TB/s, {:.0f} TFLOP/s; "
               "the table times single launches)\n", s.B, s.T, s.H, s_q, 1e3 * m.graph_ms,
               2.0 * nc / (m.graph_ms * 1e-3) / 1e12, m.flops / (m.graph_ms * 1e-3) / 1e12);
    // the floor of such a step: the same bytes read by a plain streaming kernel, also in a graph of 20 steps
    Dev sink(4);
    m.floor_ms = graph_step_ms([&](cudaStream_t st) { kernels::stream_read(c.p, nc * 2, sink.as<unsigned>(), st); }, 20, 2,
                               std::max(3, iters / 5)).first;
    fmt::print("  (B={} N={}: read floor, the same {:.1f} MB read by a plain streaming kernel in a graph of 20 steps: "
               "{:.1f} us per step, {:.2f} TB/s; the decode step is {:.2f}x it)\n", s.B, s.T, 2.0 * nc / 1e6,
               1e3 * m.floor_ms, 2.0 * nc / (m.floor_ms * 1e-3) / 1e12, m.graph_ms / m.floor_ms);
  }
  return m;
}

/// Causal MLA prefill: B sequences of T new tokens behind `prefix` cached tokens, H heads, d_c = 512.
Measured bench_mla_prefill(const Shape& s, long long prefix, int warmup, int iters, std::uint64_t seed) {
  const long long DC = 512, DN = 128, N = prefix + s.T;
  const std::size_t nc = static_cast<std::size_t>(s.B) * N * DC, nn = static_cast<std::size_t>(s.B) * s.T * DC;
  const std::size_t nq = static_cast<std::size_t>(s.B) * s.T * s.H * DC, nqc = static_cast<std::size_t>(s.B) * s.T * s.H * DN;
  Dev c(nc * 2), cnew(nn * 2), q_hi(nq * 2), q_lo(nq * 2), out(nq * 4), qC(nqc * 2), W(static_cast<std::size_t>(s.H) * DN * DC * 2);
  kernels::fill_normal_bf16(c.as<bf16_t>(), nc, seed + 1, 1.0f, nullptr);
  kernels::fill_normal_bf16(cnew.as<bf16_t>(), nn, seed + 2, 1.0f, nullptr);
  kernels::fill_normal_bf16(qC.as<bf16_t>(), nqc, seed + 3, 1.0f, nullptr);
  kernels::fill_normal_bf16(W.as<bf16_t>(), static_cast<std::size_t>(s.H) * DN * DC, seed + 4, 0.1f, nullptr);
  kernels::MlaAbsorbArgs ab;
  ab.n = static_cast<int>(s.B * s.T); ab.H = static_cast<int>(s.H); ab.d_nope = static_cast<int>(DN);
  ab.q_C = qC.as<bf16_t>(); ab.W_UK = W.as<bf16_t>(); ab.q_hi = q_hi.as<bf16_t>(); ab.q_lo = q_lo.as<bf16_t>();
  kernels::mla_absorb_query(ab, nullptr);  // q~ ~ 0.1 sqrt(128) N(0,1): logits with std ~1.3
  kernels::MlaPrefillArgs a;
  a.B = static_cast<int>(s.B); a.T = static_cast<int>(s.T); a.H = static_cast<int>(s.H);
  a.capacity = static_cast<int>(N); a.prefix = static_cast<int>(prefix);
  a.c = c.as<bf16_t>(); a.c_new = cnew.as<bf16_t>(); a.q_hi = q_hi.as<bf16_t>(); a.q_lo = q_lo.as<bf16_t>();
  a.scale = 1.0f / std::sqrt(192.0f);
  a.out = out.as<float>();
  auto [ms, mn] = time_ms([&] { kernels::mla_prefill(a, nullptr); }, warmup, iters);
  const double absorb = time_ms([&] { kernels::mla_absorb_query(ab, nullptr); }, warmup, iters).first;
  fmt::print("  (B={} T={} H={} prefix={}: query absorption {:.4f} ms; {} CTAs of 32 query rows per sequence)\n", s.B, s.T,
             s.H, prefix, absorb, (s.T * s.H + 31) / 32);
  const double pairs = static_cast<double>(s.B) * (static_cast<double>(s.T) * prefix + 0.5 * s.T * (s.T + 1.0));
  const double bytes = 2.0 * nc + 2.0 * 2.0 * nn + 2.0 * 2.0 * nq + 4.0 * nq;
  return {ms, mn, bytes, pairs * s.H * 4.0 * DC, absorb, 0.0};
}

/// MLA prefill with per-head output (kernels/mla_prefill.hpp mla_prefill_heads), naive path: append + K, V
/// reconstruction (cuBLAS) + hi/lo split + causal flash attention -> o [B, T, H, 128] fp32. Also prints the
/// rule's choice, the heads API's absorbed path (absorb + prefill + W_UV) and the P-hi-only ablation. With s.fast:
/// the same call in precision fast alone.
Measured bench_mla_prefill_naive(const Shape& s, long long prefix, int warmup, int iters, std::uint64_t seed) {
  const long long DC = 512, DN = 128, N = prefix + s.T;
  const std::size_t nc = static_cast<std::size_t>(s.B) * N * DC, nn = static_cast<std::size_t>(s.B) * s.T * DC;
  const std::size_t nqc = static_cast<std::size_t>(s.B) * s.T * s.H * DN, nw = static_cast<std::size_t>(s.H) * DN * DC;
  // W_UK and W_UV in one allocation, [W_UK; W_UV] (as one up-projection parameter): K and V are rebuilt in one cuBLAS
  // call where the keys allow (kernels::mla_kv_products_in_one_call); W2 holds them the other way round, [W_UV; W_UK],
  // to time the two-call form beside it
  Dev c(nc * 2), cnew(nn * 2), qC(nqc * 2), W(2 * nw * 2), W2(2 * nw * 2), out(nqc * 4);
  const bf16_t* Wk = W.as<bf16_t>();
  const bf16_t* Wv = W.as<bf16_t>() + nw;
  kernels::fill_normal_bf16(c.as<bf16_t>(), nc, seed + 1, 1.0f, nullptr);
  kernels::fill_normal_bf16(cnew.as<bf16_t>(), nn, seed + 2, 1.0f, nullptr);
  kernels::fill_normal_bf16(qC.as<bf16_t>(), nqc, seed + 3, 1.0f, nullptr);
  kernels::fill_normal_bf16(W.as<bf16_t>(), nw, seed + 4, 0.1f, nullptr);  // logits with std ~1.3 (as the absorbed row)
  kernels::fill_normal_bf16(W.as<bf16_t>() + nw, nw, seed + 5, 0.1f, nullptr);
  cuda_check(cudaMemcpy(W2.as<bf16_t>(), Wv, nw * 2, cudaMemcpyDeviceToDevice), "W_UV copy");
  cuda_check(cudaMemcpy(W2.as<bf16_t>() + nw, Wk, nw * 2, cudaMemcpyDeviceToDevice), "W_UK copy");
  kernels::MlaPrefillHeadsArgs a;
  a.B = static_cast<int>(s.B); a.T = static_cast<int>(s.T); a.H = static_cast<int>(s.H);
  a.capacity = static_cast<int>(N); a.prefix = static_cast<int>(prefix);
  a.c = c.as<bf16_t>(); a.c_new = cnew.as<bf16_t>(); a.q_C = qC.as<bf16_t>(); a.W_UK = Wk; a.W_UV = Wv;
  a.scale = 1.0f / std::sqrt(192.0f);
  a.out = out.as<float>();
  const kernels::MlaPrefillPath rule = kernels::mla_prefill_path_rule(a);
  const double pairs = static_cast<double>(s.B) * (static_cast<double>(s.T) * prefix + 0.5 * s.T * (s.T + 1.0));
  const double recon = static_cast<double>(s.B) * N * s.H * 2.0 * DC * (2.0 * DN);  // K and V for every key
  const double bytes = 2.0 * nc + 2.0 * 2.0 * nn + 2.0 * nqc + 4.0 * nqc + 2.0 * 2.0 * nw;
  if (s.fast) {
    a.precision = kernels::MlaPrefillPrecision::fast;
    const std::size_t wsb = kernels::mla_prefill_heads_workspace_bytes(a);
    Dev ws(wsb);
    a.workspace = ws.p; a.workspace_bytes = wsb;
    const auto [ms, mn] = time_ms([&] { kernels::mla_prefill_heads(a, nullptr); }, warmup, iters);
    // the attention's other forms (kernels::MlaFastForm), the same precision, timed beside the rule's
    std::string forms;
    for (const auto f : {kernels::MlaFastForm::wgmma, kernels::MlaFastForm::wgmma_pingpong, kernels::MlaFastForm::mma_sync}) {
      kernels::MlaPrefillOverrides ov;
      ov.fast_form = f;
      const double t = time_ms([&] { kernels::mla_prefill_heads(a, nullptr, &ov); }, warmup, iters).first;
      forms += fmt::format(", {} {:.4f} ms", kernels::mla_fast_form_name(f), t);
    }
    // the persistent grid's item orders (kernels::MlaFastOrder) in the rule's form
    forms += fmt::format("; item order {} by the rule", kernels::mla_fast_order_name(kernels::mla_fast_order_rule(a)));
    for (const auto o : {kernels::MlaFastOrder::longest_first, kernels::MlaFastOrder::head_major}) {
      kernels::MlaPrefillOverrides ov;
      ov.fast_order = o;
      const double t = time_ms([&] { kernels::mla_prefill_heads(a, nullptr, &ov); }, warmup, iters).first;
      forms += fmt::format(", {} {:.4f} ms", kernels::mla_fast_order_name(o), t);
    }
    {  // o as bf16 (MlaPrefillHeadsArgs::out_bf16), the rule's form and order
      kernels::MlaPrefillHeadsArgs a16 = a;
      a16.out = nullptr;
      a16.out_bf16 = reinterpret_cast<bf16_t*>(out.p);
      const double t = time_ms([&] { kernels::mla_prefill_heads(a16, nullptr); }, warmup, iters).first;
      forms += fmt::format("; o as bf16 {:.4f} ms", t);
    }
    {  // the weights as [W_UV; W_UK]: K and V in two cuBLAS calls
      kernels::MlaPrefillHeadsArgs a2 = a;
      a2.W_UK = W2.as<bf16_t>() + nw;
      a2.W_UV = W2.as<bf16_t>();
      const double t = time_ms([&] { kernels::mla_prefill_heads(a2, nullptr); }, warmup, iters).first;
      forms += fmt::format("; K and V in two calls {:.4f} ms (in one by the rule: {})", t,
                           kernels::mla_kv_products_in_one_call(s.B, N, DC, N * DC, a.W_UV - a.W_UK) ? "yes" : "no");
    }
    fmt::print("  (B={} T={} H={} prefix={}: precision fast (bf16 K, V, P), naive path, workspace {:.0f} MB; attention "
               "form {} by the rule{})\n",
               s.B, s.T, s.H, prefix, wsb / 1e6, kernels::mla_fast_form_name(kernels::mla_fast_form_rule()), forms);
    return {ms, mn, bytes, pairs * s.H * 4.0 * DN + recon, 0.0, 0.0};
  }
  auto timed = [&](kernels::MlaPrefillPath path, bool p_hi_only) {
    kernels::MlaPrefillOverrides ov;
    ov.path = path;
    ov.p_hi_only = p_hi_only;
    const std::size_t wsb = kernels::mla_prefill_heads_workspace_bytes(a, &ov);
    Dev ws(wsb);
    a.workspace = ws.p; a.workspace_bytes = wsb;
    const auto r = time_ms([&] { kernels::mla_prefill_heads(a, nullptr, &ov); }, warmup, iters);
    return std::tuple{r.first, r.second, wsb};
  };
  const auto [ms, mn, wsb] = timed(kernels::MlaPrefillPath::naive, false);
  const auto [ms_hi, mn_hi, wsb_hi] = timed(kernels::MlaPrefillPath::naive, true);
  const auto [ms_abs, mn_abs, wsb_abs] = timed(kernels::MlaPrefillPath::absorbed, false);
  (void)mn_hi; (void)wsb_hi; (void)mn_abs;
  fmt::print("  (B={} T={} H={} prefix={}: rule picks {}; o = W_UV a per head: naive {:.4f} ms (workspace {:.0f} MB), naive "
             "P hi only {:.4f} ms, absorbed (absorb + prefill + W_UV) {:.4f} ms (workspace {:.0f} MB), absorbed / naive "
             "{:.2f})\n",
             s.B, s.T, s.H, prefix, kernels::mla_prefill_path_name(rule), ms, wsb / 1e6, ms_hi, ms_abs, wsb_abs / 1e6,
             ms_abs / ms);
  return {ms, mn, bytes, pairs * s.H * 4.0 * DN + recon, 0.0, 0.0};
}

/// Block AttnRes: S sources (shape B), T tokens, width d (shape H), bf16 output, a ring of `ring_depth` row buffers
/// (0: the rule's).
Measured bench_attn_res(const Shape& s, int ring_depth, int warmup, int iters, std::uint64_t seed) {
  const std::size_t S = s.B, T = s.T, d = s.H;
  Dev src(S * T * d * 2), w(d * 4), out(T * d * 2);
  kernels::fill_normal_bf16(src.as<bf16_t>(), S * T * d, seed + 1, 1.0f, nullptr);
  kernels::fill_normal_f32(w.as<float>(), d, seed + 2, 3.0f / std::sqrt(static_cast<float>(d)), nullptr);
  kernels::AttnResArgs a;
  a.T = static_cast<int>(T); a.S = static_cast<int>(S); a.d = static_cast<int>(d);
  a.src = src.as<bf16_t>(); a.w = w.as<float>(); a.out = out.as<bf16_t>();
  a.ring_depth = ring_depth;
  auto [ms, mn] = time_ms([&] { kernels::attn_res(a, nullptr); }, warmup, iters);
  // the rule's tokens per CTA beside one and four (kernels::AttnResArgs::tokens_per_cta), the same process and ring
  std::string tpc;
  for (int n : {1, 4}) {
    kernels::AttnResArgs b = a;
    b.tokens_per_cta = n;
    tpc += fmt::format("{}{} a CTA {:.4f} ms", tpc.empty() ? "" : ", ", n,
                       time_ms([&] { kernels::attn_res(b, nullptr); }, warmup, iters).first);
  }
  fmt::print("  (S={} T={} d={}, a ring of {} rows{}: tokens per CTA by the rule; {})\n", S, T, d,
             ring_depth ? ring_depth : kRingDepthRule, ring_depth ? "" : " (the rule)", tpc);
  // vectors a thread (kernels::AttnResArgs::vectors_per_thread) beyond the rule's, so fewer threads a token: the
  // rule's tokens per CTA, then one and four
  const int nvec = static_cast<int>(d / 8), vrule = kernels::attn_res_vectors_per_thread_rule(static_cast<int>(d));
  std::string vpts;
  for (int v = vrule + 1; v <= kernels::attn_res_max_vpt; ++v) {
    kernels::AttnResArgs b = a;
    b.vectors_per_thread = v;
    vpts += fmt::format("{}{} ({} threads):", vpts.empty() ? "" : "; ", v, ((nvec + v - 1) / v + 31) / 32 * 32);
    for (int n : {0, 1, 4}) {
      b.tokens_per_cta = n;
      vpts += fmt::format(" {:.4f}", time_ms([&] { kernels::attn_res(b, nullptr); }, warmup, iters).first);
    }
  }
  if (!vpts.empty())
    fmt::print("  (vectors a thread, the rule's {} above; ms at the rule's / 1 / 4 tokens a CTA: {})\n", vrule, vpts);
  return {ms, mn, 2.0 * S * T * d + 2.0 * T * d, 6.0 * S * T * d};
}
#endif

/// The default shapes of every op as --help prints them ("kda-prefill 1:8192:64, ...; kda-decode ..."), made
/// from parse_shapes() so that the help cannot drift from what runs.
std::string default_shapes_help() {
  std::string r;
  for (const char* op : {"kda-prefill", "kda-decode", "kda-backward", "mla-decode", "mla-prefill", "attn-res"}) {
    r += (r.empty() ? "" : "; ") + std::string(op);
    const auto v = parse_shapes("", op);
    for (std::size_t i = 0; i < v.size(); ++i)
      r += (i ? ", " : " ") + fmt::format("{}:{}:{}", v[i].B, v[i].T, v[i].H) +
           (v[i].HV != v[i].H || v[i].D != 128 ? fmt::format(":{}", v[i].HV) : std::string()) +
           (v[i].D != 128 ? fmt::format(":{}", v[i].D) : std::string()) +
           (v[i].N0 > 0 ? fmt::format("+{}", v[i].N0) : std::string());
  }
  return r;
}

}  // namespace

void register_bench(Registry& reg) {
  auto o = std::make_shared<BenchOptions>();
  auto& c = reg.add("bench",
                    "Benchmarks of the KDA (prefill, decode, backward), MLA and AttnRes CUDA kernels: median time by "
                    "CUDA events, TB/s, TFLOP/s, % of the copy (measured) and bf16 matmul (715 TFLOP/s) ceilings, "
                    "peer time and ratio from --peer-json; "
                    "--compare BASELINE.h5 flags rows more than 10% slower (exit 1). Every option (--out last) is "
                    "checked first, the same way in every build (bad input: exit 2). Without the CUDA kernels (a "
                    "CPU build) or without a GPU: says so on stderr, measures, compares and writes nothing, exit 3.",
                    "results/bench.h5");
  auto* a = c.app;
  // the common options, as they apply to bench
  a->get_option("--out")->description("HDF5 results file (group /bench/<op>), written atomically and only when the "
                                      "benchmark runs; its folder must exist; an existing file only with --force");
  a->get_option("--seed")->description("seed of the device-side input fills (N(0,1) bf16 tensors, U(0,1) gate "
                                       "parameters), an integer in [0, 2^64 - 1] (recorded in the results file)");
  a->get_option("--quick")->description("a smoke run: --iters 5 and --warmup 1 unless given (rough times; the shapes "
                                        "are unchanged, pick small ones with --shapes)");
  a->get_option("--quiet")->description("no effect for bench (it prints no progress lines; the table is always printed)");
  a->add_option("--op", o->op,
                "kda-prefill (chunked KDA prefill), kda-decode (one KDA decode step per sequence), kda-backward (the "
                "KDA prefill's forward then its backward, kda_prefill + kda_backward; each also timed alone, with the "
                "device bytes allocated), mla-decode (absorbed "
                "MLA decode over a latent cache), mla-prefill (causal MLA prefill: absorbed, naive and fast rows), attn-res (Block Attention "
                "Residuals) or all (each of them, with its default shapes)")->capture_default_str();
  a->add_option("--prefix", o->prefix, "mla-prefill: cached tokens before the T new ones (N0) of the shapes that do not name their own (B:T:H+N0 "
                "wins over --prefix), >= 0; > 0 only with --op mla-prefill or all")->capture_default_str();
  a->add_option("--shapes", o->shapes,
                "comma-separated B:T:H[:HV] (HV a multiple of H, default H), only with a single --op; kda-prefill / kda-decode / "
                "kda-backward: "
                "B:T:H[:HV[:D]] with D = d_k = d_v in {64, 128, 256} (default 128); kda-decode: T = 1; "
                "mla-decode: B:N:H with N cached tokens, mla-prefill: B:T:H[+N0] (no HV: one latent cache for every head; +N0: "
                "N0 >= 0 cached tokens before the T new ones, the shape's own, which --prefix does not change; N0 + T <= "
                "2^31 - 1; rows with N0 > 0 get the key suffix ' N0=<N0>'); attn-res: "
                "S:T:d (sources, tokens, width, 3 fields); each field <= 2^31 - 1. Leave it out for the default (the "
                "shapes of the peer comparisons in docs/kernels/): " + default_shapes_help());
  a->add_option("--iters", o->iters, "timed launches per shape (median and min reported), >= 1")->capture_default_str();
  a->add_option("--warmup", o->warmup, "untimed launches before timing, >= 0")->capture_default_str();
  a->add_option("--peer-json", o->peer_json,
                "peer times (ms) as a JSON object keyed like the table's first column ('<op> B=.. T=.. H=.. HV=..', "
                "'attn-res S=.. T=.. d=..'), a time > 0 (finite) or null, measured on the same machine (the whole file is that "
                "one object, each key once); several files (comma-separated like every list option, space-separated or the "
                "option repeated; a file name with a comma in it cannot be given) are merged (each key in one file only; keys starting with _ are metadata and skipped), "
                "e.g. bench/fla_kda.py's and bench/torch_mla_decode.py's; each file once (two spellings of one file are a "
                "repeat); never the --out file. Default: none (peer_ms NaN)")
      ->delimiter(',');
  // --state-pass, --segments, --overlap act on the kda-prefill rows only
  const std::string kda_prefill_only =
      "Only with --op kda-prefill or all (with all it acts on the kda-prefill rows; refused with another op)";
  a->add_option("--state-pass", o->kda_state_pass,
                "kda-prefill state pass (kernels/kda.hpp KdaStatePass): auto (the rule of kda_prefill_plan), mma (one "
                "warp per 16 value columns on mma.sync; D = 64, 128), wgmma (one warpgroup per 64 value columns; D = 128, "
                "one-shot schedule) or key-split (the key dimension of S over 2 warps; D = 256). Refused when a "
                "kda-prefill shape has a D the pass does not run (the default shapes have D = 64, 128 and 256: give "
                "--shapes). " + kda_prefill_only)
      ->capture_default_str();
  a->add_option("--segments", o->kda_segments,
                "kda-prefill schedule of the state pass: 0 = the rule of kda_prefill_plan, 1 = one-shot, 2..64 = the "
                "segment-parallel path with P segments (the mma state pass; refused when a shape has D = 256, which has "
                "no segment path: the default shapes include one, so give --shapes). " + kda_prefill_only)
      ->capture_default_str();
  a->add_option("--overlap", o->kda_overlap,
                "kda-prefill: on = the library's schedule (long fixed-length batches overlap the prepare of later parts "
                "with the state pass on a side stream), off = every launch on one stream (KdaPrefillArgs::single_stream; "
                "same results). " + kda_prefill_only)
      ->capture_default_str();
  a->add_option("--precision", o->kda_precision,
                "kda-prefill state-product precision (kernels/kda.hpp KdaPrecision): fast (bf16 operands) or accurate "
                "(fp16 operands in the state products, Kd as fp16 hi + lo, values scaled by a power of two: at the bf16 "
                "floor on long-memory and repeated-key inputs; D = 128 "
                "only, the one-shot wgmma pass). accurate rows get the key suffix ' accurate' (their own baselines; the "
                "peer time is looked up under the plain key). accurate: --op kda-prefill with --shapes of D = 128 only "
                "(the default kda-prefill shapes, which --op all takes, have D = 64 and 256 rows: refused); refused "
                "with another op")
      ->capture_default_str();
  a->add_option("--bwd-pass", o->bwd_pass,
                "kda-backward pass (kernels/kda_backward.hpp KdaBackwardPass): auto (the rule: chunked_wg for D = 128, "
                "chunked for D = 64, sweep for D = 256), sweep, chunked (D = 64, 128 only) or chunked_wg (the chunked pass with its chains "
                "on wgmma; D = 128 only). A forced pass's rows get the key suffix ' sweep', ' chunked' or "
                "' chunked_wg' (their own baselines; the peer time is looked up under the plain key). Only with --op "
                "kda-backward or all; chunked is refused with a shape of D = 256, chunked_wg with a shape of D != 128")
      ->capture_default_str();
  const std::string mla_decode_only =
      "Only with --op mla-decode or all (with all it acts on the mla-decode rows; refused with another op)";
  a->add_option("--s-q", o->s_q,
                "mla-decode: query tokens per sequence, 1 <= s_q <= 4 (kernels/mla.hpp MlaDecodeArgs::s_q): multi-token "
                "decode (speculative decoding, multi-token prediction), the last s_q cached tokens causal among "
                "themselves (so every shape's N >= s_q), each cached row read once for all of them; flops = 4 B H N "
                "d_c s_q. Rows with s_q > 1 get the key suffix ' s_q=<s_q>' (their own baselines and peer times). " +
                    mla_decode_only)
      ->capture_default_str();
  a->add_option("--mla-precision", o->mla_precision,
                "mla-decode precision (kernels/mla.hpp MlaDecodePrecision): auto (the rule: accurate for --s-q 1, fast "
                "for --s-q > 1), accurate (q~ and P as bf16 hi + lo; --s-q 1 only) or fast (bf16 q~ and P, FlashMLA's "
                "precision). Rows whose precision is not the rule's get the key suffix ' fast' or ' accurate' (their "
                "own baselines; the peer time is looked up under the key without it). " + mla_decode_only)
      ->capture_default_str();
  a->add_option("--mla-splits", o->mla_splits,
                "mla-decode slices per sequence (kernels/mla.hpp MlaDecodeOverrides::num_splits), >= 0: 0 = the plan's "
                "choice (its wave model); N > 0 asks for N slices, rounded to whole 64-token blocks and at most one "
                "slice per 32 tokens (the row's plan line says what ran). Rows with N > 0 get the key suffix "
                "' splits=N' (their own baselines; the peer time is looked up under the key without it). " +
                    mla_decode_only)
      ->capture_default_str();
  a->add_option("--ring-depth", o->ring_depth,
                "attn-res: row buffers in the ring of source rows each CTA keeps in shared memory "
                "(kernels/attn_res.hpp AttnResArgs::ring_depth): 0 = the rule (3), or n = 2..8. A ring of n rows takes "
                "4 d + 2 d n bytes of shared memory, at most 231808 (227 KB less the kernel's 640 static bytes), so a "
                "shape whose d does not fit is refused (e.g. d = 16384 above n = 5). Every depth gives the same "
                "output bit for bit; depth 3 runs the default kernels, other depths kernels compiled for a depth "
                "given at run time (slower where the default is already near the copy rate). Rows timed at a depth other than the "
                "rule's 3 get the key suffix ' ring=<n>' (their own baselines; the peer time is looked up under the "
                "plain key). Only with --op attn-res or all (with all it acts on the attn-res rows; refused with "
                "another op)")
      ->capture_default_str();
  a->add_option("--compare", o->compare,
                "baseline bench results file(s) to compare against: prints time / baseline per row found (same group, "
                "same key), flags rows more than 10% slower and then exits 1; several files (comma-separated like every list "
                "option, space-separated or the option repeated; a file name with a comma in it cannot be given): each "
                "row is looked up in them in order, e.g. data/baselines/h200.h5,mine.h5; each file "
                "once (two spellings of one file are a repeat); each "
                "file is checked completely first (/bench/<op>: a string 'key' and a numeric 'time_ms' of one length) "
                "and is never the --out file; the rows without a baseline row are counted. "
                "Default: none. Without a GPU nothing is compared: exit 3, never 0")
      ->delimiter(',');
  c.inputs = {"compare", "peer-json"};  // cli::run: a file given twice (any spelling) is a repeat, never --out
  // check (cli::run, before --out): every option, the --peer-json files and the --compare files; then cli::run's shared
  // path refuses an --out that is one of the inputs (--config, --compare, --peer-json) and checks --out itself; run
  // times what check planned
  auto plan = std::make_shared<BenchPlan>();
  c.check = [o, plan](Context& ctx) {
    require(o->op == "kda-prefill" || o->op == "kda-decode" || o->op == "kda-backward" || o->op == "mla-decode" ||
                o->op == "mla-prefill" || o->op == "attn-res" || o->op == "all",
            "--op = '" + o->op + "'; accepted: kda-prefill, kda-decode, kda-backward, mla-decode, mla-prefill, "
                                 "attn-res, all");
    require(o->prefix >= 0, "--prefix = " + std::to_string(o->prefix) + "; accepted: >= 0 cached tokens");
    require(o->iters >= 1, "--iters = " + std::to_string(o->iters) + "; accepted: an integer >= 1 (timed launches per shape)");
    require(o->warmup >= 0, "--warmup = " + std::to_string(o->warmup) + "; accepted: an integer >= 0 (untimed launches)");
    if (ctx.common.quick) {  // a smoke run: fewer launches unless --iters / --warmup were given (or set in --config)
      if (ctx.app->get_option("--iters")->count() == 0) o->iters = 5;
      if (ctx.app->get_option("--warmup")->count() == 0) o->warmup = 1;
    }
    require(o->kda_overlap == "on" || o->kda_overlap == "off",
            "--overlap = '" + o->kda_overlap + "'; accepted: on (the library's schedule) or off (one stream)");
    require(o->kda_state_pass == "auto" || o->kda_state_pass == "mma" || o->kda_state_pass == "wgmma" ||
                o->kda_state_pass == "key-split",
            "--state-pass = '" + o->kda_state_pass + "'; accepted: auto, mma, wgmma or key-split");
    require(o->kda_segments >= 0 && o->kda_segments <= 64,
            "--segments = " + std::to_string(o->kda_segments) + "; accepted: 0 (the rule), 1 (one-shot) or 2..64 segments");
    require(o->kda_segments < 2 || o->kda_state_pass == "auto" || o->kda_state_pass == "mma",
            "--segments " + std::to_string(o->kda_segments) + " with --state-pass " + o->kda_state_pass +
                "; accepted: the segment path runs the mma state pass (--state-pass auto or mma)");
    require(o->kda_precision == "fast" || o->kda_precision == "accurate",
            "--precision = '" + o->kda_precision + "'; accepted: fast or accurate");
    require(o->kda_precision == "fast" ||
                ((o->kda_state_pass == "auto" || o->kda_state_pass == "wgmma") && o->kda_segments < 2),
            "--precision accurate with --state-pass " + o->kda_state_pass + " --segments " +
                std::to_string(o->kda_segments) + "; accepted: accurate runs the one-shot wgmma pass (--state-pass auto "
                "or wgmma, --segments 0 or 1)");
    require(o->bwd_pass == "auto" || o->bwd_pass == "sweep" || o->bwd_pass == "chunked" ||
                o->bwd_pass == "chunked_wg",
            "--bwd-pass = '" + o->bwd_pass + "'; accepted: auto, sweep, chunked or chunked_wg");
    require(o->s_q >= 1 && o->s_q <= 4,
            "--s-q = " + std::to_string(o->s_q) + "; accepted: 1 <= --s-q <= 4 query tokens per sequence");
    require(o->mla_precision == "auto" || o->mla_precision == "accurate" || o->mla_precision == "fast",
            "--mla-precision = '" + o->mla_precision + "'; accepted: auto, accurate or fast");
    require(o->mla_splits >= 0, "--mla-splits = " + std::to_string(o->mla_splits) +
                                    "; accepted: >= 0 slices per sequence (0 = the plan's choice)");
    require(o->ring_depth == 0 || (o->ring_depth >= 2 && o->ring_depth <= kRingDepthMax),
            "--ring-depth = " + std::to_string(o->ring_depth) + "; accepted: 0 (the rule: " +
                std::to_string(kRingDepthRule) + " row buffers) or 2.." + std::to_string(kRingDepthMax) +
                " row buffers");
    require(o->mla_precision != "accurate" || o->s_q == 1,
            "--mla-precision accurate with --s-q " + std::to_string(o->s_q) +
                "; accepted: accurate runs one query token (--s-q 1); --s-q > 1 runs fast (or auto, which picks fast)");
    // options that act on one op only, set to other than their default, are refused with another op, not dropped
    // silently; --op all takes each of them (it acts on that op's rows)
    struct OneOpOption {
      bool set;           // given with a value other than the default (BenchOptions{})
      std::string given;  // the option and its value, as the message names them
      const char* op;     // the op it acts on
    };
    const BenchOptions def;
    for (const OneOpOption& x :
         {OneOpOption{o->prefix != def.prefix, "--prefix " + std::to_string(o->prefix), "mla-prefill"},
          OneOpOption{o->kda_state_pass != def.kda_state_pass, "--state-pass " + o->kda_state_pass, "kda-prefill"},
          OneOpOption{o->kda_segments != def.kda_segments, "--segments " + std::to_string(o->kda_segments), "kda-prefill"},
          OneOpOption{o->kda_overlap != def.kda_overlap, "--overlap " + o->kda_overlap, "kda-prefill"},
          OneOpOption{o->kda_precision != def.kda_precision, "--precision " + o->kda_precision, "kda-prefill"},
          OneOpOption{o->bwd_pass != def.bwd_pass, "--bwd-pass " + o->bwd_pass, "kda-backward"},
          OneOpOption{o->s_q != def.s_q, "--s-q " + std::to_string(o->s_q), "mla-decode"},
          OneOpOption{o->mla_precision != def.mla_precision, "--mla-precision " + o->mla_precision, "mla-decode"},
          OneOpOption{o->mla_splits != def.mla_splits, "--mla-splits " + std::to_string(o->mla_splits), "mla-decode"},
          OneOpOption{o->ring_depth != def.ring_depth, "--ring-depth " + std::to_string(o->ring_depth), "attn-res"}})
      require(!x.set || o->op == x.op || o->op == "all",
              x.given + " applies to --op " + x.op + " (or all) only, not --op " + o->op);
    require(ctx.app->get_option("--shapes")->count() == 0 || !o->shapes.empty(),
            "--shapes is empty; leave it out for the default shapes");
    // --op all runs kda-backward last: after its buffers (37 GB at 65536 x 32) were allocated and freed in this
    // process, the mla-decode 1M row ran 14% slower (H100: 0.431 ms; 0.379 ms alone and right after kda-backward in
    // another process), so an op after it would be timed in a state its baseline was not (docs/kernels/mla_decode.md).
    std::vector<std::string> ops =
        o->op == "all" ? std::vector<std::string>{"kda-prefill", "kda-decode", "mla-decode", "mla-prefill", "attn-res",
                                                  "kda-backward"}
                       : std::vector<std::string>{o->op};
    require(o->op != "all" || o->shapes.empty(),
            "--shapes needs a single --op (kda-prefill, kda-decode, kda-backward, mla-decode, mla-prefill or attn-res)");
    std::vector<std::vector<Shape>> shapes;
    for (const auto& op : ops) {
      const auto& typed = ctx.app->get_option("--prefix")->results();  // quoted as typed in parse_shapes' messages
      shapes.push_back(parse_shapes(o->shapes, op, o->prefix, typed.empty() ? std::string() : typed.back()));
      if (op == "mla-prefill") {  // each shape's naive-path and fast rows right after its absorbed row
        std::vector<Shape> rows;
        for (Shape s : shapes.back()) {
          rows.push_back(s);
          s.naive = true;
          rows.push_back(s);
          s.fast = true;
          rows.push_back(s);
        }
        shapes.back() = rows;
      }
    }
    // kda-backward: --bwd-pass chunked or chunked_wg where that pass does not run (kda_backward_plan's rule), refused
    // here in every build, before any GPU work
    for (std::size_t i = 0; i < ops.size(); ++i) {
      if (ops[i] != "kda-backward" || (o->bwd_pass != "chunked" && o->bwd_pass != "chunked_wg")) continue;
      const bool wg = o->bwd_pass == "chunked_wg";
      for (const Shape& s : shapes[i])
        require((wg ? s.D == 128 : s.D != 256) && s.B <= 65535,
                "--bwd-pass " + o->bwd_pass + " does not run at shape " + std::to_string(s.B) + ":" +
                    std::to_string(s.T) + ":" + std::to_string(s.H) + ":" + std::to_string(s.HV) + ":" +
                    std::to_string(s.D) + (o->shapes.empty() ? " (a default shape)" : "") +
                    (wg ? "; accepted: D = 128 and B <= 65535" : "; accepted: D = 64 or 128 and B <= 65535") +
                    " (the sweep, --bwd-pass sweep or auto, runs every shape)");
    }
    // mla-decode: the s_q query tokens are the last s_q cached ones, so N >= s_q (the kernel refuses max_len < s_q);
    // refused here in every build, before any GPU work (not by the kernel mid-run, nor exit 3 in a CPU build)
    for (std::size_t i = 0; i < ops.size(); ++i) {
      if (ops[i] != "mla-decode") continue;
      for (const Shape& s : shapes[i]) {
        const std::string shape = std::to_string(s.B) + ":" + std::to_string(s.T) + ":" + std::to_string(s.H);
        require(s.T >= o->s_q, "--s-q " + std::to_string(o->s_q) + " with N = " + std::to_string(s.T) + " (shape " +
                                   shape + "); accepted: N >= --s-q cached tokens (the query tokens are the last "
                                   "cached ones)");
        // the kernel's own limits (kernels/mla.hpp MlaDecodeArgs: H, B)
        require((s.H == 16 || s.H == 32) && s.B <= 65535, "mla-decode does not run shape " + shape +
                                                              "; accepted: H = 16 or 32 query heads and B <= 65535 "
                                                              "sequences");
      }
    }
    // attn-res: the pseudo-query and a ring of --ring-depth rows must fit in a CTA's shared memory (the kernel refuses
    // it too, but only mid-run and not in a CPU build); the rule's ring fits every d the kernel takes (d <= 16384; a
    // larger d the kernel refuses at any depth)
    for (std::size_t i = 0; i < ops.size(); ++i) {
      if (ops[i] != "attn-res" || o->ring_depth == 0) continue;
      for (const Shape& s : shapes[i]) {
        if (s.H > 16384) continue;
        const long long bytes = 4 * s.H + 2LL * o->ring_depth * s.H;
        require(bytes <= kAttnResSmemMax,
                "--ring-depth " + std::to_string(o->ring_depth) + " with d = " + std::to_string(s.H) + " (shape " +
                    std::to_string(s.B) + ":" + std::to_string(s.T) + ":" + std::to_string(s.H) + ") needs " +
                    std::to_string(bytes) + " bytes of shared memory (4 d + 2 d n); accepted: at most " +
                    std::to_string(kAttnResSmemMax) + " (227 KB less the kernel's 640 static bytes): --ring-depth <= " +
                    std::to_string((kAttnResSmemMax - 4 * s.H) / (2 * s.H)) + " at this d");
      }
    }
    // kda-prefill options that cannot act on the chosen shapes are refused here, before any GPU work (they were
    // refused by the kernel mid-run, or did nothing)
    for (std::size_t i = 0; i < ops.size(); ++i) {
      if (ops[i] != "kda-prefill") continue;
      for (const Shape& s : shapes[i]) {
        const std::string& sp = o->kda_state_pass;
        const bool runs = sp == "auto" || (sp == "mma" && s.D != 256) || (sp == "wgmma" && s.D == 128) ||
                          (sp == "key-split" && s.D == 256);
        require(runs,
                "--state-pass " + sp + " does not run at D = " + std::to_string(s.D) + " (shape " + std::to_string(s.B) +
                    ":" + std::to_string(s.T) + ":" + std::to_string(s.H) + ":" + std::to_string(s.HV) + ":" +
                    std::to_string(s.D) + (o->shapes.empty() ? ", a default shape" : "") +
                    "); accepted: mma at D = 64, 128, wgmma at D = 128, key-split at D = 256, or auto" +
                    (o->op == "all" ? std::string(" (--op all takes only its default shapes: use --op kda-prefill "
                                                  "with --shapes)")
                                    : std::string(" (give --shapes with that D only)")));
        require(o->kda_precision == "fast" || s.D == 128,
                "--precision accurate does not run at D = " + std::to_string(s.D) + " (shape " + std::to_string(s.B) +
                    ":" + std::to_string(s.T) + ":" + std::to_string(s.H) + ":" + std::to_string(s.HV) + ":" +
                    std::to_string(s.D) + (o->shapes.empty() ? ", a default shape" : "") + "); accepted: D = 128 " +
                    (o->op == "all" ? std::string("(--op all takes only its default shapes: use --op kda-prefill with "
                                                  "--shapes)")
                                    : std::string("(give --shapes with D = 128 only)")));
        require(o->kda_segments < 2 || s.D != 256,
                "--segments " + std::to_string(o->kda_segments) + " forces the segment-parallel state pass, which D = 256 " +
                    "does not have (shape " + std::to_string(s.B) + ":" + std::to_string(s.T) + ":" + std::to_string(s.H) +
                    ":" + std::to_string(s.HV) + ":256" + (o->shapes.empty() ? ", a default shape" : "") +
                    "); accepted with D = 256: --segments 0 (the rule) or 1 (one-shot), or " +
                    (o->op == "all" ? std::string("--op kda-prefill with --shapes without D = 256 (--op all takes only "
                                                  "its default shapes)")
                                    : std::string("give --shapes without D = 256")));
      }
    }
    check_input_files(ctx, "peer-json");  // regular files, none twice: after the options (a FIFO came before --op)
    nlohmann::json peer = nlohmann::json::object();
    for (std::size_t pi = 0; pi < o->peer_json.size(); ++pi) {
      const std::string& pj = o->peer_json[pi];
      std::error_code ec;
      require(!std::filesystem::is_directory(pj, ec), "--peer-json: '" + pj + "' is a directory; give a JSON file");
      std::ifstream f(pj, std::ios::binary);
      require(f.good(), "--peer-json: cannot open '" + pj + "'" + comma_split_note("--peer-json", o->peer_json, pi));
      const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      // the whole file is one JSON value (trailing text refused), and no object in it repeats a key (nlohmann
      // would keep the last one silently): cli::parse_json_once, the reader of --config too
      // parsed twice: `one` holds the values (types kept: "0.9" as a string is refused), `typed` the same document
      // with each non-integer number as its text as typed, for the messages (1e-400 is quoted as 1e-400, not 0.0;
      // parse_json_once's numbers_as_typed, as for --config)
      std::string repeated;
      nlohmann::json one, typed;
      try {
        one = parse_json_once(text, repeated);
        typed = parse_json_once(text, repeated, true);
      } catch (const std::exception& e) {
        throw Error("--peer-json: '" + pj + "' is not valid JSON (one object, nothing after it): " + e.what());
      }
      require(repeated.empty(), "--peer-json: '" + pj + "': key '" + repeated +
                                    "' appears twice in the file; give each key once");
      require(one.is_object(), "--peer-json: '" + pj + "' must hold a JSON object");
      for (auto it = one.begin(); it != one.end(); ++it) {  // keys starting with '_' are metadata (e.g. _fla_meta)
        if (!it.key().empty() && it.key()[0] == '_') continue;
        const bool ok = it.value().is_null() ||
                        (it.value().is_number() && std::isfinite(it.value().get<double>()) && it.value().get<double>() > 0);
        const nlohmann::json& as_typed = typed.at(it.key());
        const std::string shown = it.value().is_number() && as_typed.is_string() ? as_typed.get<std::string>()
                                                                                  : it.value().dump();
        require(ok, "--peer-json: '" + pj + "': key '" + it.key() + "' has the value " + shown +
                        "; accepted: a time in milliseconds (a finite number > 0) or null (not measured)");
        require(!peer.contains(it.key()), "--peer-json: key '" + it.key() + "' is in two peer files (the second is '" +
                                              pj + "'); give each shape's peer time once");
        peer[it.key()] = it.value();
      }
    }
    std::vector<std::string> grps;  // the bench groups of the ops timed: bench/kda_prefill, bench/attn_res, ...
    for (std::string g : ops) {
      std::replace(g.begin(), g.end(), '-', '_');
      grps.push_back(g);
    }
    [[maybe_unused]] std::vector<BaselineRows> baselines;  // every --compare file read completely now, before any GPU work
    check_input_files(ctx, "compare");
    for (std::size_t i = 0; i < o->compare.size(); ++i)
      baselines.push_back(read_compare_file(o->compare[i], grps, comma_split_note("--compare", o->compare, i)));
    *plan = BenchPlan{std::move(ops), std::move(shapes), std::move(peer), std::move(grps), std::move(baselines)};
  };
  c.run = [o, plan]([[maybe_unused]] Context& ctx) -> int {  // ctx: unused without the CUDA kernels
    // the options, inputs and --out were checked (check above, then cli::run: --out not an input, --out itself)
    [[maybe_unused]] const auto& [ops, shapes, peer, grps, baselines] = *plan;
    // Only now: can this build and machine run the benchmark at all? Not 0 (nothing was measured or compared),
    // not 2 (the input was fine): kExitNotAvailable.
    const std::string nothing = o->compare.empty() ? "nothing was measured or written"
                                                   : "nothing was measured, compared or written";
#ifndef KDALAB_HAVE_CUDA
    fmt::print(stderr, "kdalab bench: not available in this build: the CUDA kernels are not built (build with "
                       "`cmake --preset cuda` and run on a GPU); {} (exit {})\n", nothing, kExitNotAvailable);
    return kExitNotAvailable;
#else
    int ndev = 0;
    if (const cudaError_t e = cudaGetDeviceCount(&ndev); e != cudaSuccess || ndev == 0) {
      cudaGetLastError();
      fmt::print(stderr, "kdalab bench: not available on this machine: no GPU visible ({}); {} (exit {})\n",
                 e != cudaSuccess ? cudaGetErrorString(e) : "0 devices", nothing, kExitNotAvailable);
      return kExitNotAvailable;
    }
    const double copy_tbs = copy_ceiling_tbs();
    const double mm_tflops = 715.0;
    fmt::print("copy ceiling (1 GiB D2D, read + write): {:.2f} TB/s; bf16 matmul ceiling (dense, not measured): {:.0f} TFLOP/s\n",
               copy_tbs, mm_tflops);
    auto f = ctx.open_results();
    f->group("bench", "KDA kernel timings (kdalab bench)");
    f->attr("bench", "copy_ceiling_TBps", copy_tbs);
    f->attr("bench", "matmul_ceiling_TFLOPps", mm_tflops);
    bool flagged = false;
    std::vector<std::string> no_baseline;  // --compare: keys of the rows no baseline file holds
    for (std::size_t oi = 0; oi < ops.size(); ++oi) {
      const std::string& op = ops[oi];
      std::string grp = "bench/" + op;  // the op with '_' for '-': bench/kda_prefill, bench/attn_res, ...
      std::replace(grp.begin(), grp.end(), '-', '_');
      std::vector<std::string> bkeys;
      std::vector<double> bms;
      for (const BaselineRows& bl : baselines)  // rows of every baseline file; the first file holding a key wins
        if (const auto it = bl.groups.find(grps[oi]); it != bl.groups.end()) {
          bkeys.insert(bkeys.end(), it->second.first.begin(), it->second.first.end());
          bms.insert(bms.end(), it->second.second.begin(), it->second.second.end());
        }
      Table t;
      t.col("key", 's', "1", "op and shape").col("B", 'i', "1", "batch (sequences)").col("T", 'i', "1", "tokens per sequence")
          .col("H", 'i', "1", "key heads").col("HV", 'i', "1", "value heads").col("D", 'i', "1", "d_k = d_v (KDA); d_c (MLA)")
          .col("time_ms", 'd', "ms", "median kernel time (CUDA events; kda-decode B <= 8: per step of a 100-step graph; mla-decode: single launches, the graph step in graph_ms)")
          .col("time_min_ms", 'd', "ms", "fastest of the timed launches")
          .col("prepare_ms", 'd', "ms", "prefill: the token-parallel prepare kernel alone (median); decode: 0")
          .col("state_ms", 'd', "ms", "prefill: the chunk-sequential state pass alone (median); decode: 0")
          .col("bytes", 'd', "B", "least bytes moved: inputs read once, outputs written once (no workspace)")
          .col("flops", 'd', "FLOP", "floating-point operations of the algorithm")
          .col("TBps", 'd', "TB/s", "bytes / median time").col("TFLOPps", 'd', "TFLOP/s", "flops / median time")
          .col("pct_copy", 'd', "%", "TB/s over the copy ceiling measured in this run")
          .col("pct_matmul", 'd', "%", "TFLOP/s over the bf16 matmul ceiling (715 TFLOP/s)")
          .col("peer_ms", 'd', "ms", "peer time from --peer-json (fla for KDA, the torch baseline for MLA), NaN if none")
          .col("speedup_vs_peer", 'd', "1", "peer_ms / time_ms")
          .col("baseline_ms", 'd', "ms", "time in --compare file, NaN if none")
          .col("ratio_vs_baseline", 'd', "1", "time_ms / baseline_ms (> 1.10 flagged)")
          .col("graph_ms", 'd', "ms", "mla-decode with B <= 8: per step in a CUDA graph of 20 steps (the decode loop's "
               "time, no host launch gap); NaN otherwise")
          .col("read_floor_ms", 'd', "ms", "mla-decode with B <= 8: the same latent bytes read by a plain streaming "
               "kernel (kernels/common/stream_read.hpp) in a CUDA graph of 20 steps: what a memory-bound step cannot beat; NaN "
               "otherwise")
          .col("fwd_ms", 'd', "ms", "kda-backward: the forward (kda_prefill with S_final) alone (median); NaN otherwise")
          .col("bwd_ms", 'd', "ms", "kda-backward: the backward (kda_backward) alone (median); NaN otherwise")
          .col("bwd_bytes", 'd', "B", "kda-backward: the backward's bytes model of the pass that ran (inputs, "
               "outputs, the workspace regions; docs/kernels/kda_backward.md); NaN otherwise")
          .col("bwd_flops", 'd', "FLOP", "kda-backward: the backward's flops model (the pass that ran: the "
               "sweep's fp32 work on the state, or the chunked pass's products); NaN otherwise")
          .col("peak_bytes", 'd', "B", "kda-backward: device bytes allocated for the row (inputs, outputs, the prefill "
               "and backward workspaces); NaN otherwise");
      // kda-backward rows print the forward and the backward alone where kda-prefill rows print their two phases
      const bool bwd_op = op == "kda-backward";
      fmt::print("{:<40}{:>10}{:>9}{:>9}{:>9}{:>10}{:>8}{:>8}{:>10}{:>9}{:>10}\n", op, "ms", bwd_op ? "fwd ms" : "prep ms",
                 bwd_op ? "bwd ms" : "state ms", "TB/s", "TFLOP/s", "%copy", "%mm", "peer ms", "speedup", "vs base");
      for (const Shape& s : shapes[oi]) {
        const std::string plain_key = key_of(op, s);
        const bool accurate = op == "kda-prefill" && o->kda_precision == "accurate";
        const bool bwd_forced = op == "kda-backward" && o->bwd_pass != "auto";
        const bool mla_decode = op == "mla-decode";
        // mla-decode: the s_q suffix is part of the peer's key too (a one-token peer is not a multi-token one)
        const std::string peer_key = mla_decode ? plain_key + mla_decode_suffix(o->s_q, o->mla_precision, false) : plain_key;
        const std::string key = accurate     ? plain_key + " accurate"
                                : bwd_forced ? plain_key + " " + o->bwd_pass
                                : mla_decode ? plain_key + mla_decode_suffix(o->s_q, o->mla_precision, true) +
                                                   (o->mla_splits > 0 ? " splits=" + std::to_string(o->mla_splits) : "")
                                : op == "attn-res" && o->ring_depth != 0 && o->ring_depth != kRingDepthRule
                                    ? plain_key + " ring=" + std::to_string(o->ring_depth)
                                    : plain_key;
        const Measured m =
            op == "kda-prefill"   ? bench_prefill(s, o->warmup, o->iters, ctx.common.seed,
                                                  prefill_overrides(o->kda_state_pass, o->kda_segments),
                                                  o->kda_overlap == "off", accurate)
            : op == "mla-decode"  ? bench_mla_decode(s, o->s_q, mla_precision_of(o->mla_precision), o->mla_splits,
                                                     o->warmup, o->iters, ctx.common.seed)
            : op == "mla-prefill" && s.naive ? bench_mla_prefill_naive(s, s.N0, o->warmup, o->iters, ctx.common.seed)
            : op == "mla-prefill" ? bench_mla_prefill(s, s.N0, o->warmup, o->iters, ctx.common.seed)
            : op == "attn-res"    ? bench_attn_res(s, o->ring_depth, o->warmup, o->iters, ctx.common.seed)
            : op == "kda-backward" ? bench_backward(s, o->warmup, o->iters, ctx.common.seed, o->bwd_pass)
                                  : bench_decode(s, o->warmup, o->iters, ctx.common.seed);
        const double tbs = m.bytes / (m.ms * 1e-3) / 1e12, tfl = m.flops / (m.ms * 1e-3) / 1e12;
        const double nan = std::numeric_limits<double>::quiet_NaN();
        double pm = nan;
        if (peer.contains(peer_key) && peer[peer_key].is_number()) pm = peer[peer_key].get<double>();
        double bm = nan;
        for (std::size_t i = 0; i < bkeys.size() && i < bms.size(); ++i)
          if (bkeys[i] == key) { bm = bms[i]; break; }
        if (!o->compare.empty() && !std::isfinite(bm)) no_baseline.push_back(key);
        const double ratio = m.ms / bm;
        const bool slow = std::isfinite(ratio) && ratio > 1.10;
        flagged = flagged || slow;
        t.row({key, static_cast<std::int64_t>(s.B), static_cast<std::int64_t>(s.T), static_cast<std::int64_t>(s.H),
               static_cast<std::int64_t>(s.HV), std::int64_t{op == "mla-decode" || op == "mla-prefill" ? 512 : op == "attn-res" ? s.H : s.D}, m.ms, m.ms_min, m.prepare_ms, m.state_ms, m.bytes, m.flops, tbs, tfl,
               100.0 * tbs / copy_tbs, 100.0 * tfl / mm_tflops, pm, pm / m.ms, bm, ratio, m.graph_ms, m.floor_ms,
               m.fwd_ms, m.bwd_ms, m.bwd_bytes, m.bwd_flops, m.peak_bytes});
        fmt::print("{:<40}{:>10.4f}{:>9.4f}{:>9.4f}{:>9.2f}{:>10.1f}{:>8.1f}{:>8.2f}{:>10.4f}{:>9.2f}{:>10}{}\n", key, m.ms,
                   bwd_op ? m.fwd_ms : m.prepare_ms, bwd_op ? m.bwd_ms : m.state_ms, tbs, tfl,
                   100.0 * tbs / copy_tbs, 100.0 * tfl / mm_tflops, pm, pm / m.ms,
                   std::isfinite(ratio) ? fmt::format("{:.3f}", ratio) : std::string("-"),
                   slow ? "  SLOWER >10%" : "");
      }
      f->write_table(grp, t);
    }
    f->commit();
    fmt::print("wrote {}\n", ctx.common.out);
    if (!o->compare.empty())
      fmt::print("bench --compare: {} rows have no baseline row{}{}\n", no_baseline.size(), no_baseline.empty() ? "" : ": ",
                 fmt::join(no_baseline, ", "));
    if (flagged) {
      fmt::print("bench: rows more than 10% slower than {} (see above)\n", fmt::join(o->compare, ", "));
      return 1;
    }
    return 0;
#endif
  };
}

}  // namespace kdalab::cli
