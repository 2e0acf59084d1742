// Explicit instantiations in double of the templates that reference/ and numerics/ declare `extern template`
// (the KDALAB_TEMPLATES_* lists at the end of each header): compiled here once, linked by every other file.
#include "reference/mla_backward.hpp"

namespace kdalab {
KDALAB_TEMPLATES_MLA(, double)
KDALAB_TEMPLATES_MLA_BACKWARD(, double)
}  // namespace kdalab
