#include "ops/ref/topk.h"

#include <algorithm>
#include <numeric>

namespace spw::ref {

std::vector<int32_t> topk_indices(const float* values, size_t n, size_t k) {
  std::vector<int32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  k = std::min(k, n);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    return values[a] > values[b] || (values[a] == values[b] && a < b);
  });
  idx.resize(k);
  return idx;
}

}  // namespace spw::ref
