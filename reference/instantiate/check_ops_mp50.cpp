// Explicit instantiations in mp50 of the templates that reference/ and numerics/ declare `extern template`
// (the KDALAB_TEMPLATES_* lists at the end of each header): compiled here once, linked by every other file.
#include "numerics/check_ops.hpp"

namespace kdalab {
KDALAB_TEMPLATES_CHECK_OPS(, mp50)
}  // namespace kdalab
