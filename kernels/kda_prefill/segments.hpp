#pragma once
// Private to kernels/kda_prefill/: the segment path's host entry (segments.cu), called by launch.cu.
#include <cstddef>

#include "kernels/kda_prefill/common.cuh"

namespace kdalab::kernels::kda_prefill_detail {

/// One run of the segment path: the checked parameters (p.ws = the workspace), shapes, the plan (P >= 2 segments of
/// seg_chunks chunks), the workspace bytes of the chunk slots (the segment buffers follow them: 3 (P - 1) N HV D^2
/// fp32), and which phases run (KdaPrefillOverrides::phases).
struct SegmentRun {
  Params p;
  int D, HV, N, max_chunks, P, seg_chunks;
  std::size_t slot_bytes;
  bool prepare, state;
};
/// The prepare, pass 1, the combine (P >= 3) and pass 2, in order on `stream`. Errors: kdalab::Error when N P exceeds
/// the grid limit (65535).
void run_segment_path(const SegmentRun& r, cudaStream_t stream);

}  // namespace kdalab::kernels::kda_prefill_detail
