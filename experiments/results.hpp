#pragma once
/// The HDF5 results writer and reader (schema: docs/results-schema.md).
///
/// One file per run. Root attributes (variable-length UTF-8 strings): software, software_version,
/// git_sha, date, command_line, config, host, device, seed. One group per experiment; inside it
/// datasets with `units` and `description` attributes; sweep tables are 1-D column datasets of one
/// length. The HDF5 file is built in memory; commit() writes its bytes with write_file_atomically(), the
/// one write path of every file kdalab creates. If the writer is destroyed without commit() (an
/// exception, a failed run) nothing reaches the disk, so no partial file is ever left and an old file is
/// never overwritten unless `force` was given.
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "reference/tensor.hpp"

namespace kdalab {

/// The environment failed while a file was written or its folder was checked: no space, an I/O error, a
/// permission. The message names the path and the errno text; the command line exits 5 (docs/cli.md).
class EnvironmentError : public std::runtime_error {
 public:
  explicit EnvironmentError(const std::string& what) : std::runtime_error(what) {}
};

/// Writes `bytes` to `path` so that `path` is either untouched or holds all of them:
///  - a temporary "<name>.tmp.<pid>.<random>" in the same folder, created exclusively (O_CREAT | O_EXCL |
///    O_NOFOLLOW: a symlink planted there is never followed), written with every return code checked, fsynced;
///  - renamed onto `path`: without `force` by renameat2(RENAME_NOREPLACE) (or link + unlink where the file
///    system has no renameat2), so a file that appeared at `path` meanwhile is never replaced (kdalab::Error,
///    exit 2); with `force` by rename(), which replaces a symlink at `path` itself, never the file it points to;
///  - the folder fsynced after the rename;
///  - the temporary removed on every error and on SIGINT, SIGTERM, SIGHUP and SIGPIPE (the handler removes it,
///    then the signal is raised again with its default action);
///  - temporaries of `path` left by processes that no longer run are removed first (one line on stderr each).
/// An environment failure throws EnvironmentError naming the path and errno.
void write_file_atomically(const std::string& path, const std::string& bytes, bool force);

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

/// Checks before any work starts that `path` may be written: refuses an existing file (or a symlink,
/// dangling or not) without `force`, an existing --out that is not a regular file (a folder, FIFO, device: never replaced, even with `force`),
/// an output folder that does not exist and a path the system cannot look up (too long). Throws kdalab::Error
/// naming --out; a folder kdalab may not write to throws EnvironmentError (exit 5).
void check_output_path(const std::string& path, bool force);

class ResultsFile {
 public:
  /// Starts the file in memory and writes the root attributes. Throws kdalab::Error (naming --out)
  /// if the file exists and !force or the folder is missing; EnvironmentError if it is not writable.
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
  /// Sets a string attribute on a group ("/" for the root; created if needed) or on an existing dataset.
  void attr(const std::string& group, const std::string& name, const std::string& value);
  /// Sets a numeric attribute on a group ("/" for the root; created if needed) or on an existing dataset.
  void attr(const std::string& object, const std::string& name, double value);
  /// Writes the file to its path with write_file_atomically(). After this the file exists. It closes the file,
  /// even when the write fails: a write or a second commit() after it throws kdalab::Error.
  void commit();
  const std::string& path() const { return path_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string path_;
  bool force_ = false, closed_ = false;
  /// Throws kdalab::Error naming the file once commit() has closed it.
  void require_open() const;
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
