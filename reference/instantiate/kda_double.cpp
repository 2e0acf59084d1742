// Explicit instantiations in double of the templates that reference/ and numerics/ declare `extern template`
// (the KDALAB_TEMPLATES_* lists at the end of each header): compiled here once, linked by every other file.
#include "reference/kda.hpp"
#include "reference/kda_chunk.hpp"
#include "reference/kda_decode.hpp"

namespace kdalab {
KDALAB_TEMPLATES_KDA(, double)
KDALAB_TEMPLATES_KDA_DM(, double)
KDALAB_TEMPLATES_KDA_CHUNK(, double)
KDALAB_TEMPLATES_KDA_CHUNK_DM(, double)
KDALAB_TEMPLATES_KDA_DECODE(, double)
}  // namespace kdalab
