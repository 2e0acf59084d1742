#pragma once
/// Sharded sweeps (docs/cluster.md): `--shard I/N` on the sweeping subcommands (parity, recall, copy, decay-range,
/// decode-cost's CPU part) runs a deterministic part of the grid, and `kdalab merge` joins the shard files into the file
/// the unsharded run writes (timing columns aside).
///
/// Indexing: I in [1, N] (Slurm's job array indices --array=1-N map to shards directly). A grid point's inputs depend
/// on the point and --seed only, never on which other points run, so a shard's rows equal those rows of the unsharded
/// run bit for bit.
///
/// Assignment: each subcommand gives every grid point an expected cost (its own cost model, documented at its
/// ShardPlan); points are taken longest first (ties: lower index first) and each goes to the shard with the least
/// total cost so far (ties: lower shard index). Every shard of N <= points gets at least one point; N > points is
/// refused (an empty shard would write a file without rows).
///
/// A shard file is an ordinary results file plus: root attributes shard ("I/N"), shard_index, shard_count,
/// shard_subcommand, shard_points (the grid points it covers, ascending, comma separated), grid_points and
/// shard_cost_model; each table or array whose rows depend on the shard carries the attribute shard_row_keys, the
/// merge order of its rows; a group attribute shard_note_events (parity) carries what the merge needs to rebuild its
/// notes; a group with the attribute shard_row_groups (train_recall's runs) holds one child group per grid point,
/// which the merge takes from every shard (each child once). kdalab merge drops these and records the shards in the
/// root attribute merged_shards. python -m kdalab.train_recall writes shard files by the same rules
/// (python/kdalab/train_recall.py).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "experiments/results.hpp"

namespace kdalab::cli {

/// --shard parsed: index in [1, count]; count 0 means the whole grid.
struct ShardSpec {
  std::size_t index = 0, count = 0;
  bool active() const { return count > 0; }
};

/// Parses --shard's value "I/N" (decimal integers without leading zeros, 1 <= I <= N <= 100000); `given`: the option was
/// given (then "" is refused too), else the whole grid. Throws kdalab::Error "--shard: 'V' is not accepted; give I/N
/// with integers 1 <= I <= N <= 100000 (...)" (exit 2).
ShardSpec parse_shard(const std::string& value, bool given);

/// The shard (1-based) of each grid point: longest first, each to the least loaded shard (ties: lower index). cost:
/// one expected cost per point (any positive unit; non-finite or negative counts as 0). count >= 1.
std::vector<std::size_t> assign_shards(const std::vector<double>& cost, std::size_t count);

/// The points one run covers: every point when the spec is not active, else those assign_shards() gives it.
class ShardPlan {
 public:
  /// Throws kdalab::Error naming --shard when the grid has fewer points than shards (exit 2, nothing written).
  /// cost_model: one sentence recorded in the shard file's root attribute shard_cost_model.
  ShardPlan(const ShardSpec& spec, const std::vector<double>& cost, const std::string& cost_model);
  bool active() const { return spec_.active(); }
  /// Whether this run computes grid point `p`.
  bool runs(std::size_t p) const { return !active() || owner_[p] == spec_.index; }
  std::size_t grid() const { return owner_.size(); }
  /// The root attributes of a shard file (nothing when not active).
  void record(ResultsFile& f, const std::string& subcommand) const;
  /// The attribute shard_row_keys of `object` (a table group or an array): one key per row, the order kdalab merge
  /// sorts the rows of every shard into (stable). Nothing when not active.
  void mark_rows(ResultsFile& f, const std::string& object, const std::vector<std::int64_t>& keys) const;

 private:
  ShardSpec spec_;
  std::vector<std::size_t> owner_;
  std::string cost_model_;
};

/// The merged content of the shards, as kdalab merge holds it before writing: every group and dataset of the first
/// shard, the sharded tables and arrays joined. A per-subcommand hook (merge_hooks()) rebuilds what is derived from the
/// rows (summaries, notes).
struct MergedData {
  using Attr = std::variant<std::string, double>;
  using Data = std::variant<std::vector<double>, std::vector<std::int64_t>, std::vector<std::string>>;
  struct Node {
    bool group = true;
    std::map<std::string, Attr> attrs;
    Data data;                        ///< datasets only
    std::vector<std::size_t> dims;    ///< datasets only
  };
  std::map<std::string, Node> nodes;  ///< by absolute path ("/parity/table/impl"); "/" is the root
  std::vector<std::string> shard_files;
  /// Group attributes every shard has in its own version (shard_note_events), per shard, in shard order.
  std::map<std::string, std::vector<std::string>> per_shard_attr;

  /// The table at group path `g` (its 1-D column datasets, in name order) as a Table.
  Table table(const std::string& g) const;
  /// Replaces the columns of the table at `g` by `t`'s.
  void set_table(const std::string& g, const Table& t);
};

/// What a subcommand adds to kdalab merge: rebuilding its derived datasets and attributes from the merged rows.
using MergeHook = std::function<void(MergedData&)>;
/// Per subcommand name ("parity", ...): the hook; a subcommand without one has nothing derived.
std::map<std::string, MergeHook>& merge_hooks();

}  // namespace kdalab::cli
