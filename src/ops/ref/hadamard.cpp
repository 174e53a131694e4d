#include "ops/ref/hadamard.h"

#include <cmath>

namespace spw::ref {

void hadamard_rows(float* x, size_t n_rows, size_t n) {
  const float scale = 1.0f / std::sqrt(float(n));
  for (size_t r = 0; r < n_rows; ++r) {
    float* v = x + r * n;
    for (size_t h = 1; h < n; h *= 2)
      for (size_t i = 0; i < n; i += 2 * h)
        for (size_t j = i; j < i + h; ++j) {
          float a = v[j], b = v[j + h];
          v[j] = a + b;
          v[j + h] = a - b;
        }
    for (size_t i = 0; i < n; ++i) v[i] *= scale;
  }
}

}  // namespace spw::ref
