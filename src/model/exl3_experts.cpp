#include "model/exl3_experts.h"

namespace spw {

Result<Linear> load_exl3_expert_linear(const Exl3Lookup& lookup, const std::string& stem, int n_out, int n_in) {
  auto t = exl3_load(lookup, stem);
  if (!t.ok()) return t.error();
  const int64_t k_want = (int64_t(n_in) + 127) / 128 * 128, n_want = (int64_t(n_out) + 127) / 128 * 128;
  if (t->k != k_want || t->n != n_want)
    return make_error("EXL3 tensor ", stem, ": stored as [k=", t->k, ", n=", t->n, "], expected [", k_want, ", ",
                      n_want, "] for in_features ", n_in, ", out_features ", n_out, " from config.json");
  if (!t->bias.empty()) return make_error("EXL3 tensor ", stem, ": routed experts have no bias, found ", stem, ".bias");
  std::vector<float> w = exl3_weight_ref(*t);  // [k][n]
  Linear l;
  l.n_out = n_out;
  l.n_in = n_in;
  l.kind = LinearKind::Bf16;
  l.w.resize(size_t(n_out) * n_in);
  for (int o = 0; o < n_out; ++o)
    for (int i = 0; i < n_in; ++i) l.w[size_t(o) * n_in + i] = w[size_t(i) * t->n + o];
  return l;
}

}  // namespace spw
