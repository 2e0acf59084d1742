#pragma once
/// kdalab::Error: the one exception type for bad input anywhere in kdalab.
///
/// Every message names the tensor / option / key, the offending index or value and what is
/// accepted (docs/cli.md, errors and exit codes). The command line turns it into one line on stderr and exit 2.
#include <cstdio>
#include <stdexcept>
#include <string>

namespace kdalab {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

/// Short decimal text of a number for error messages (6 significant digits).
inline std::string num_str(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

/// Throws kdalab::Error(msg) when cond is false; used for argument checks.
inline void require(bool cond, const std::string& msg) {
  if (!cond) throw Error(msg);
}

}  // namespace kdalab
