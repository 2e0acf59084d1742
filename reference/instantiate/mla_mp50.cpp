// Explicit instantiations in mp50 of the templates that reference/ and numerics/ declare `extern template`
// (the KDALAB_TEMPLATES_* lists at the end of each header): compiled here once, linked by every other file.
#include "reference/mla_backward.hpp"

namespace kdalab {
KDALAB_TEMPLATES_MLA(, mp50)
KDALAB_TEMPLATES_MLA_BACKWARD(, mp50)
}  // namespace kdalab
