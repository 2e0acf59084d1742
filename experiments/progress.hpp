#pragma once
/// Progress of long work on stderr: on a terminal one updating line with percent, rate
/// and ETA; off a terminal one plain line every `interval` seconds (default 5, env
/// KDALAB_PROGRESS_INTERVAL overrides); nothing with quiet. finish() prints the final line.
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <string>

namespace kdalab {

class Progress {
 public:
  Progress(std::string label, std::size_t total, bool quiet, std::FILE* out = stderr);
  ~Progress();
  /// Marks `n` more units done and redraws when due. `what` names the current item (optional).
  void tick(std::size_t n = 1, const std::string& what = "");
  void finish();

 private:
  void draw(bool final);
  std::string label_, what_;
  std::size_t total_, done_ = 0;
  bool quiet_, tty_, finished_ = false;
  double interval_;
  std::FILE* out_;
  std::chrono::steady_clock::time_point start_, last_;
};

}  // namespace kdalab
