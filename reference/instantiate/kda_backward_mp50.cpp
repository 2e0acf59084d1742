// Explicit instantiations in mp50 of the templates that reference/ and numerics/ declare `extern template`
// (the KDALAB_TEMPLATES_* lists at the end of each header): compiled here once, linked by every other file.
#include "reference/kda_backward.hpp"
#include "reference/kda_chunk_backward.hpp"
#include "reference/kda_fused_backward.hpp"

namespace kdalab {
KDALAB_TEMPLATES_KDA_BACKWARD(, mp50)
KDALAB_TEMPLATES_KDA_BACKWARD_DM(, mp50)
KDALAB_TEMPLATES_KDA_CHUNK_BACKWARD(, mp50)
KDALAB_TEMPLATES_KDA_FUSED_BACKWARD(, mp50)
}  // namespace kdalab
