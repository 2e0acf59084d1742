// Explicit instantiations in double of the templates that reference/ and numerics/ declare `extern template`
// (the KDALAB_TEMPLATES_* lists at the end of each header): compiled here once, linked by every other file.
#include "reference/attn_res_backward.hpp"
#include "reference/gate_backward.hpp"
#include "reference/hybrid.hpp"
#include "reference/kda_layer_backward.hpp"
#include "reference/layers_backward.hpp"

namespace kdalab {
KDALAB_TEMPLATES_ATTN_RES(, double)
KDALAB_TEMPLATES_ATTN_RES_BACKWARD(, double)
KDALAB_TEMPLATES_GATE(, double)
KDALAB_TEMPLATES_GATE_BACKWARD(, double)
KDALAB_TEMPLATES_LAYERS(, double)
KDALAB_TEMPLATES_LAYERS_BACKWARD(, double)
KDALAB_TEMPLATES_KDA_LAYER_BACKWARD(, double)
KDALAB_TEMPLATES_HYBRID(, double)
}  // namespace kdalab
