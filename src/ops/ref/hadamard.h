// Fast Walsh–Hadamard transform, Sylvester (natural) order, scaled by 1/sqrt(n) (V4 indexer).
#pragma once

#include <cstddef>

namespace spw::ref {

// In place over each row of x[n_rows, n]; n must be a power of two.
void hadamard_rows(float* x, size_t n_rows, size_t n);

}  // namespace spw::ref
