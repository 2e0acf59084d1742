#pragma once
// Forwarding header: the device helpers moved to kernels/common/kda_math.cuh and the host checks to
// kernels/common/cuda_check.hpp. Include those directly; this file goes once no kernel includes it.
#include "kernels/common/cuda_check.hpp"
#include "kernels/common/kda_math.cuh"
