// spw_cuda_ops argmax and sample (cuda/ops/sampling.h) against plain CPU references written here:
// argmax with ties to the lower id, and sample_ref below, which is runtime/sampler.cpp's
// Sampler::draw without penalties (sort by logit descending, ties by id; top-k; p = exp((l − l0)/T) in
// f64; drop trailing zero-probability candidates; min-p; top-p; invert the CDF at u·Σp).
// Shapes: V4.1's vocabulary 129280 with 1..64 sequences, and vocabularies 1, 7, 17, 1023; logits
// with heavy ties and with −inf (masked) entries; per-sequence parameters mixed in one call,
// including greedy rows, top_k 1, top_k ≥ vocab, top_p 0, tiny temperatures; u including 0.
// Tolerance: token ids must match exactly. The GPU sums p in a different order and CUDA's f64 exp may
// differ from glibc's by an ulp, so a mismatch needs u·Σp (or top_p·Σp) within ~1e-15 relative of a
// CDF boundary: it does not happen on these inputs; a failure prints the case to look at.
#if defined(SPW_HAVE_CUDA)
#include <algorithm>
#include <iostream>
#include <numeric>
#include <random>

#include "cuda/ops/sampling.h"
#include "test_cuda_ops_util.h"

namespace spw {
namespace {

using cuda_test::bits_equal;
using cuda_test::Guarded;

int32_t argmax_ref(const float* l, int64_t vocab) {
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i)
    if (l[i] > l[best]) best = i;
  return int32_t(best);
}

int32_t sample_ref(const float* l, int64_t vocab, const cuda::SampleParams& sp, double u) {
  if (sp.temperature <= 0.f) return argmax_ref(l, vocab);
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
  size_t n_keep = (sp.top_k > 0 && sp.top_k < vocab) ? size_t(sp.top_k) : size_t(vocab);
  const double inv_t = 1.0 / sp.temperature, top = l[order[0]];
  std::vector<double> p(n_keep);
  double sum = 0;
  for (size_t i = 0; i < n_keep; ++i) sum += (p[i] = std::exp((double(l[order[i]]) - top) * inv_t));
  while (n_keep > 1 && p[n_keep - 1] == 0) --n_keep;
  if (sp.min_p > 0.f) {
    const double floor_p = sp.min_p * p[0];
    size_t n = 1;
    while (n < n_keep && p[n] >= floor_p) ++n;
    for (size_t i = n; i < n_keep; ++i) sum -= p[i];
    n_keep = n;
  }
  if (sp.top_p < 1.f) {
    const double target = sp.top_p * sum;
    double kept = 0;
    size_t n = 0;
    while (n < n_keep && kept < target) kept += p[n++];
    n_keep = std::max<size_t>(n, 1);
    sum = kept > 0 ? kept : p[0];
  }
  double r = u * sum;
  for (size_t i = 0; i < n_keep; ++i) {
    r -= p[i];
    if (r < 0) return order[i];
  }
  return order[n_keep - 1];
}

enum class Dist { kNormal, kTies, kMasked };

std::vector<float> make_logits(int64_t n_seqs, int64_t vocab, Dist dist, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 3.f);
  std::vector<float> l(size_t(n_seqs * vocab));
  for (auto& v : l) {
    v = nd(rng);
    if (dist == Dist::kTies) v = std::round(v * 2.f) / 2.f;  // ~40 distinct values
    if (dist == Dist::kMasked && rng() % 4 != 0) v = -INFINITY;
  }
  for (int64_t s = 0; s < n_seqs; ++s) {
    float* row = l.data() + s * vocab;
    if (dist == Dist::kMasked) row[rng() % vocab] = 0.5f;  // at least one finite logit
    if (dist == Dist::kTies && vocab > 3) row[vocab - 1] = row[1] = row[2] = 40.f;  // tied maxima
  }
  return l;
}

const char* dist_name(Dist d) { return d == Dist::kNormal ? "normal" : d == Dist::kTies ? "ties" : "masked"; }

TEST(CudaOpsSampling, ArgmaxTiesToLowerId) {
  SPW_REQUIRE_GPU();
  uint32_t seed = 1;
  for (int64_t vocab : {129280, 1, 7, 17, 1023})
    for (int64_t n_seqs : {1, 4, 64})
      for (Dist dist : {Dist::kNormal, Dist::kTies, Dist::kMasked}) {
        SCOPED_TRACE(testing::Message() << "argmax vocab=" << vocab << " n_seqs=" << n_seqs << " " << dist_name(dist));
        const std::vector<float> l = make_logits(n_seqs, vocab, dist, ++seed);
        std::vector<int32_t> want(n_seqs);
        for (int64_t s = 0; s < n_seqs; ++s) want[s] = argmax_ref(l.data() + s * vocab, vocab);
        Guarded<float> dl(l);
        Guarded<int32_t> dout{size_t(n_seqs)};
        SPW_ASSERT_OK(cuda::argmax(dl.get(), n_seqs, vocab, dout.get(), nullptr));
        EXPECT_TRUE(bits_equal(dout.download(), want));
        EXPECT_TRUE(dout.guards_intact());
      }
}

// Parameter sets cycled over the sequences of a call.
const cuda::SampleParams kParams[] = {
    {1.0f, 0, 1.0f, 0.0f},  {0.7f, 50, 0.9f, 0.0f},    {1.3f, 0, 0.95f, 0.05f}, {0.0f, 0, 1.0f, 0.0f},
    {0.01f, 0, 1.0f, 0.0f}, {1.0f, 1, 1.0f, 0.0f},     {1.0f, 1 << 30, 0.5f, 0.0f}, {0.9f, 0, 0.0f, 0.0f},
    {2.0f, 1000, 1.0f, 0.1f}, {0.6f, 20, 0.8f, 0.02f},
};

void sample_case(int64_t n_seqs, int64_t vocab, Dist dist, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "sample vocab=" << vocab << " n_seqs=" << n_seqs << " " << dist_name(dist));
  const std::vector<float> l = make_logits(n_seqs, vocab, dist, seed);
  std::vector<cuda::SampleParams> params(n_seqs);
  for (int64_t s = 0; s < n_seqs; ++s) params[s] = kParams[(s + seed) % std::size(kParams)];
  auto ws_nbytes = cuda::sample_workspace_nbytes(n_seqs, vocab);
  ASSERT_TRUE(ws_nbytes.ok()) << ws_nbytes.error().message;
  Guarded<float> dl(l);
  Guarded<cuda::SampleParams> dp(params);
  Guarded<uint8_t> ws(*ws_nbytes);
  std::mt19937_64 rng(seed);
  for (int rep = 0; rep < 4; ++rep) {
    std::vector<double> u(n_seqs);
    for (auto& x : u) x = double(rng() >> 11) * 0x1.0p-53;  // the server's uniform01
    if (rep == 0) u[0] = 0.0;
    std::vector<int32_t> want(n_seqs);
    for (int64_t s = 0; s < n_seqs; ++s) want[s] = sample_ref(l.data() + s * vocab, vocab, params[s], u[s]);
    Guarded<double> du(u);
    Guarded<int32_t> dout{size_t(n_seqs)};
    SPW_ASSERT_OK(cuda::sample(dl.get(), n_seqs, vocab, dp.get(), du.get(), ws.get(), *ws_nbytes, dout.get(), nullptr));
    const std::vector<int32_t> got = dout.download();
    for (int64_t s = 0; s < n_seqs; ++s) {
      const cuda::SampleParams& sp = params[s];
      EXPECT_EQ(got[s], want[s]) << "seq " << s << " rep " << rep << ": T=" << sp.temperature << " top_k=" << sp.top_k
                                 << " top_p=" << sp.top_p << " min_p=" << sp.min_p << " u=" << u[s];
    }
    EXPECT_TRUE(dout.guards_intact());
    EXPECT_TRUE(ws.guards_intact()) << "workspace overrun";
  }
  EXPECT_TRUE(bits_equal(dl.download(), l)) << "logits modified";
}

TEST(CudaOpsSampling, SampleRealVocabulary) {
  SPW_REQUIRE_GPU();
  sample_case(1, 129280, Dist::kNormal, 1);
  sample_case(4, 129280, Dist::kTies, 2);
  sample_case(16, 129280, Dist::kMasked, 3);
  sample_case(64, 129280, Dist::kNormal, 4);
}

TEST(CudaOpsSampling, SampleAwkwardSizes) {
  SPW_REQUIRE_GPU();
  uint32_t seed = 10;
  for (int64_t vocab : {1, 7, 17, 1023})
    for (int64_t n_seqs : {1, 7, 17})
      for (Dist dist : {Dist::kNormal, Dist::kTies, Dist::kMasked}) sample_case(n_seqs, vocab, dist, ++seed);
}

TEST(CudaOpsSampling, RejectsBadShapes) {
  EXPECT_FALSE(cuda::sample_workspace_nbytes(0, 100).ok());
  EXPECT_FALSE(cuda::sample_workspace_nbytes(1 << 16, 1 << 16).ok());  // ≥ 2^31 logits
  EXPECT_FALSE(cuda::argmax(nullptr, 1, 0, nullptr, nullptr).ok());
}

}  // namespace
}  // namespace spw
#endif  // SPW_HAVE_CUDA
