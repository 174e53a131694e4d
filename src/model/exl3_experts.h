// Routed experts stored as EXL3 (`layers.L.ffn.experts.E.w{1,2,3}.{trellis,suh,svh,mcg|mul1}`, as
// `spillway quantize` and exllamav3 write them) for the CPU reference forward: dequantized once
// at load with the reference decoder (formats/exl3: W = diag(suh)·Hk·Ŵ·Hn·diag(svh), fp64, rounded
// once to fp32) and used as an unquantized BF16-precision linear (no FP8 activation quantization:
// EXL3 products take the activation as it is). Spec ../shared/specs/exl3.md §1.6, §2.4.
// Tests: tests/unit/test_exl3_quantize_pack.cpp (a quantized pack loads and runs).
#pragma once

#include <string>

#include "base/status.h"
#include "formats/exl3.h"
#include "model/weights.h"

namespace spw {

// The linear [n_out, n_in] of an EXL3 tensor with stored shape k = in (padded to 128),
// n = out (padded); padding rows/columns are dropped. Errors name the tensor and shapes.
Result<Linear> load_exl3_expert_linear(const Exl3Lookup& lookup, const std::string& stem, int n_out, int n_in);

}  // namespace spw
