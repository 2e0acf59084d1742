// Explicit instantiations in double of the templates that reference/ and numerics/ declare `extern template`
// (the KDALAB_TEMPLATES_* lists at the end of each header): compiled here once, linked by every other file.
#include "reference/kda_backward.hpp"
#include "reference/kda_chunk_backward.hpp"
#include "reference/kda_fused_backward.hpp"

namespace kdalab {
KDALAB_TEMPLATES_KDA_BACKWARD(, double)
KDALAB_TEMPLATES_KDA_BACKWARD_DM(, double)
KDALAB_TEMPLATES_KDA_CHUNK_BACKWARD(, double)
KDALAB_TEMPLATES_KDA_FUSED_BACKWARD(, double)
}  // namespace kdalab
