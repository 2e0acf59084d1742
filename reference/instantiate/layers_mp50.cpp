// Explicit instantiations in mp50 of the templates that reference/ and numerics/ declare `extern template`
// (the KDALAB_TEMPLATES_* lists at the end of each header): compiled here once, linked by every other file.
#include "reference/attn_res_backward.hpp"
#include "reference/gate_backward.hpp"
#include "reference/hybrid.hpp"
#include "reference/kda_layer_backward.hpp"
#include "reference/layers_backward.hpp"

namespace kdalab {
KDALAB_TEMPLATES_ATTN_RES(, mp50)
KDALAB_TEMPLATES_ATTN_RES_BACKWARD(, mp50)
KDALAB_TEMPLATES_GATE(, mp50)
KDALAB_TEMPLATES_GATE_BACKWARD(, mp50)
KDALAB_TEMPLATES_LAYERS(, mp50)
KDALAB_TEMPLATES_LAYERS_BACKWARD(, mp50)
KDALAB_TEMPLATES_KDA_LAYER_BACKWARD(, mp50)
KDALAB_TEMPLATES_HYBRID(, mp50)
}  // namespace kdalab
