// Explicit instantiations in float of the templates that reference/ and numerics/ declare `extern template`
// (the KDALAB_TEMPLATES_* lists at the end of each header): compiled here once, linked by every other file.
#include "reference/kda_backward.hpp"
#include "reference/kda_chunk.hpp"
#include "reference/kda_decode.hpp"

namespace kdalab {
KDALAB_TEMPLATES_KDA(, float)
KDALAB_TEMPLATES_KDA_CHUNK(, float)
KDALAB_TEMPLATES_KDA_DECODE(, float)
KDALAB_TEMPLATES_KDA_BACKWARD(, float)
}  // namespace kdalab
