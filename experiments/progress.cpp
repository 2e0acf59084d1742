#include "experiments/progress.hpp"

#include <unistd.h>

#include <cstdlib>

#include <fmt/format.h>

namespace kdalab {

Progress::Progress(std::string label, std::size_t total, bool quiet, std::FILE* out)
    : label_(std::move(label)), total_(total), quiet_(quiet), out_(out) {
  tty_ = ::isatty(::fileno(out_)) != 0;
  interval_ = tty_ ? 0.2 : 5.0;
  if (const char* e = std::getenv("KDALAB_PROGRESS_INTERVAL")) interval_ = std::atof(e);
  start_ = last_ = std::chrono::steady_clock::now();
}

Progress::~Progress() {
  if (!finished_ && done_ > 0) finish();
}

void Progress::tick(std::size_t n, const std::string& what) {
  done_ += n;
  if (!what.empty()) what_ = what;
  const auto now = std::chrono::steady_clock::now();
  if (done_ >= total_) {
    finish();
    return;
  }
  if (std::chrono::duration<double>(now - last_).count() >= interval_) {
    last_ = now;
    draw(false);
  }
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  draw(true);
}

void Progress::draw(bool final) {
  if (quiet_) return;
  const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double pct = total_ ? 100.0 * static_cast<double>(done_) / static_cast<double>(total_) : 100.0;
  const double rate = el > 0 ? static_cast<double>(done_) / el : 0.0;
  const double eta = rate > 0 && total_ >= done_ ? static_cast<double>(total_ - done_) / rate : 0.0;
  std::string line = fmt::format("{}: {:5.1f}% ({}/{}) {:.2f}/s, elapsed {:.1f} s, ETA {:.1f} s", label_, pct, done_,
                                 total_, rate, el, eta);
  if (!what_.empty()) line += "  [" + what_ + "]";
  if (tty_) {
    fmt::print(out_, "\r\033[K{}{}", line, final ? "\n" : "");
  } else {
    fmt::print(out_, "{}\n", line);
  }
  std::fflush(out_);
}

}  // namespace kdalab
