#pragma once
// The working-set note of `kdalab decode-cost` (experiments/decode_cost.cpp): why the CPU-measured softmax read can
// grow faster than n, set against this machine's caches. Declared here so a test can give it fixed timings.
#include <string>
#include <vector>

namespace kdalab::cli {

/// One data or unified CPU cache level of CPU 0 as Linux reports it (/sys/devices/system/cpu/cpu0/cache/index*/).
struct CacheLevel {
  int level = 0;
  std::string type;         ///< "Data" or "Unified"
  double bytes = 0;         ///< size in bytes
  std::string shared_cpus;  ///< CPUs sharing it, e.g. "0-1"
};

/// Why the measured CPU softmax read can grow faster than n: its working set, K and V (2 n d float) plus n float
/// logits, against `caches` (smallest level first). n, sec: the softmax rows in increasing n (tokens, seconds);
/// d the head dimension. Names the pair of consecutive n where the time per number read rises most, when it rises
/// more than 1.5x; otherwise says that no such step was seen. Then each step whose time per number read rises more
/// than 1.5x while its working set leaves a cache level (the smaller one 0.5x..1.25x that cache's size, the larger
/// past 1.25x) is named as plausibly that cache's edge (not measured: no cache-miss counts). One line (printed and
/// recorded as decode_cost/cpu's `note`); never throws on sizes (rows past the shorter of n and sec are left out).
/// Rows whose n or sec is not finite and > 0 (a zero or NaN timing) are left out and counted at the end of the note.
std::string softmax_cache_note(const std::vector<double>& n, const std::vector<double>& sec, double d,
                               const std::vector<CacheLevel>& caches);

}  // namespace kdalab::cli
