#include <algorithm>
#include <vector>

#include "formats/quant.h"
#include "model/forward_context.h"
#include "ops/ref/linalg.h"

namespace spw::detail {

void to_activation(const ForwardContext& s, float* x, size_t n) {
  if (s.num.bf16_activations) ref::round_bf16_inplace(x, n);
}

void linear(const ForwardContext& s, const Linear& l, const float* x, int n_tokens, float* y, bool round_out) {
  const bool quantized = l.kind == LinearKind::Fp8 || l.kind == LinearKind::Fp4;
  if (quantized && s.num.fake_quant) {
    // [n_tokens, n_in] activation quantized per block of act_block along the row. A tensor-parallel rank's slice
    // of a down projection's input can be narrower than a block (model/parallel_model.h): it is quantized as one
    // block of its own (the whole block's amax is on no single rank). A full model's n_in is always a multiple.
    const int block = std::min(s.c.act_block, l.n_in);
    std::vector<float> xq(x, x + size_t(n_tokens) * l.n_in);
    for (int t = 0; t < n_tokens; ++t) fake_quant_fp8(xq.data() + size_t(t) * l.n_in, l.n_in, block);
    ref::matmul_nt(xq.data(), l.w.data(), y, n_tokens, l.n_in, l.n_out);
  } else {
    ref::matmul_nt(x, l.w.data(), y, n_tokens, l.n_in, l.n_out);
  }
  if (l.kind != LinearKind::F32 && round_out) to_activation(s, y, size_t(n_tokens) * l.n_out);
}

}  // namespace spw::detail
