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
    // [n_tokens, n_in] activation quantized per block of act_block along the row.
    std::vector<float> xq(x, x + size_t(n_tokens) * l.n_in);
    for (int t = 0; t < n_tokens; ++t) fake_quant_fp8(xq.data() + size_t(t) * l.n_in, l.n_in, s.c.act_block);
    ref::matmul_nt(xq.data(), l.w.data(), y, n_tokens, l.n_in, l.n_out);
  } else {
    ref::matmul_nt(x, l.w.data(), y, n_tokens, l.n_in, l.n_out);
  }
  if (l.kind != LinearKind::F32 && round_out) to_activation(s, y, size_t(n_tokens) * l.n_out);
}

}  // namespace spw::detail
