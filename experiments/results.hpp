#pragma once
/// The HDF5 results writer and reader (schema: docs/results-schema.md).
///
/// One file per run. Root attributes (variable-length UTF-8 strings): software, software_version,
/// git_sha, date, command_line, config, host, device, seed. One group per experiment; inside it
/// datasets with `units` and `description` attributes; sweep tables are 1-D column datasets of one
/// length. The file is written to "<out>.tmp.<pid>" and renamed onto <out> by commit(); if the
/// writer is destroyed without commit() (an exception, a failed run) the temporary is removed, so
/// no partial file is ever left and an old file is never overwritten unless `force` was given.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "reference/tensor.hpp"

namespace kdalab {

/// Root attributes of a results file (all strings; seed as decimal text).
struct RunInfo {
  std::string command_line, config_json, seed;
};

/// One column of a table: name, units ("1", "s", "B", "B/s", "FLOP/s"), description and data.
struct Column {
  std::string name, units, description;
  std::variant<std::vector<double>, std::vector<std::int64_t>, std::vector<std::string>> data;
  std::size_t size() const;
};

/// A table built row by row: declare columns, then append rows of cells in declaration order.
class Table {
 public:
  using Cell = std::variant<double, std::int64_t, std::string>;
  /// kind: 'd' double, 'i' integer, 's' string.
  Table& col(const std::string& name, char kind, const std::string& units, const std::string& description);
  /// Appends one row; throws kdalab::Error if the count or a cell's kind does not match.
  void row(const std::vector<Cell>& cells);
  std::size_t rows() const { return n_rows_; }
  const std::vector<Column>& columns() const { return cols_; }
  /// Column by name (throws kdalab::Error if absent).
  const Column& column(const std::string& name) const;

 private:
  std::vector<Column> cols_;
  std::size_t n_rows_ = 0;
};

/// Checks before any work starts that `path` may be written: refuses an existing file without
/// `force`, an existing --out that is not a regular file (a folder, FIFO, device: never replaced, even with `force`),
/// an output folder that does not exist and a path the system cannot look up (too long). Throws kdalab::Error
/// naming --out.
void check_output_path(const std::string& path, bool force);

class ResultsFile {
 public:
  /// Opens "<path>.tmp.<pid>" and writes the root attributes. Throws kdalab::Error (naming --out)
  /// if the file exists and !force, or the folder is missing or not writable.
  ResultsFile(const std::string& path, bool force, const RunInfo& info);
  ~ResultsFile();
  ResultsFile(const ResultsFile&) = delete;
  ResultsFile& operator=(const ResultsFile&) = delete;

  /// Creates (or reuses) group `group` with a description attribute.
  void group(const std::string& group, const std::string& description);
  /// Writes every column of `table` as a 1-D dataset in `group` (created if needed).
  void write_table(const std::string& group, const Table& table);
  /// Writes an N-d float64 array with units, description and extra string attributes.
  void write_array(const std::string& group, const std::string& name, const Tensor<double>& t,
                   const std::string& units, const std::string& description,
                   const std::map<std::string, std::string>& attrs = {});
  /// Sets a string attribute on a group ("/" for the root).
  void attr(const std::string& group, const std::string& name, const std::string& value);
  /// Sets a numeric attribute on a group or dataset path.
  void attr(const std::string& object, const std::string& name, double value);
  /// Flushes, closes and renames the temporary onto the final path. After this the file exists.
  void commit();
  const std::string& path() const { return path_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string path_, tmp_;
  bool force_ = false, committed_ = false;
};

/// Reading (for `kdalab check`, golden tests, `bench --compare`). All throw kdalab::Error naming
/// the file and the dataset/attribute when it is missing or of the wrong kind.
namespace h5read {
bool exists(const std::string& file, const std::string& path);
Tensor<double> array(const std::string& file, const std::string& dataset);
std::vector<std::string> strings(const std::string& file, const std::string& dataset);
bool has_attr(const std::string& file, const std::string& object, const std::string& name);
std::string attr_string(const std::string& file, const std::string& object, const std::string& name);
double attr_double(const std::string& file, const std::string& object, const std::string& name);
/// Names of the members of a group.
std::vector<std::string> members(const std::string& file, const std::string& group);
}  // namespace h5read

/// Build and host facts for root attributes and `kdalab info`.
std::string software_version();
std::string git_sha();
std::string host_name();
std::string device_description();
std::string iso8601_utc_now();

}  // namespace kdalab
