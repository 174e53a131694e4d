// cpu/host_moe_worker.h: a test thread plays the GPU side of the mailbox protocol (cpu/host_moe_mailbox.h)
// and checks every answer against exl3_moe_cpu run directly on the slots placed on the CPU. Cases: several
// requests in a row over two layers (each answered once, in order, y zeroed before each), slots the GPU keeps
// (id < 0) left out, a request after the worker has gone idle (its sleep), and a request naming an expert
// the worker does not hold (answered with zeros and counted, the worker keeps serving). The worker runs the
// same kernel on the same inputs, so the answers are compared bit for bit.
#if defined(SPW_HAVE_CPU)
#include "cpu/host_moe_worker.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "exl3_random.h"

namespace spw {
namespace {

constexpr int64_t kD = 128, kF = 256, kTopK = 3, kMaxTokens = 8;
constexpr int kExperts = 6;

struct Layer {
  std::vector<test::OwnedExl3> w;  // w1, w3, w2 per expert
  std::vector<Exl3ExpertWeights> all;
};

void make_layer(Layer& L, uint32_t seed) {
  std::mt19937 rng(seed);
  L.w.resize(3 * kExperts);
  for (int e = 0; e < kExperts; ++e) {
    test::fill_random_exl3(L.w[3 * e], kD, kF, 6, Exl3Codebook::kMul1, rng, 1.f, false);
    test::fill_random_exl3(L.w[3 * e + 1], kD, kF, 6, Exl3Codebook::kMul1, rng, 1.f, false);
    test::fill_random_exl3(L.w[3 * e + 2], kF, kD, 6, Exl3Codebook::kMul1, rng, 0.03f, false);
  }
  for (int e = 0; e < kExperts; ++e) L.all.push_back({&L.w[3 * e].t, &L.w[3 * e + 1].t, &L.w[3 * e + 2].t});
}

// The worker's view: experts 1, 3 and 4 of every layer are on the CPU.
std::vector<Exl3ExpertWeights> cpu_part(const Layer& L) {
  std::vector<Exl3ExpertWeights> v(kExperts);
  for (int e : {1, 3, 4}) v[e] = L.all[e];
  return v;
}

class Gpu {  // the poster's side, on host memory
 public:
  explicit Gpu(const HostMoeMailboxLayout& layout) : bytes_(layout.nbytes() + 64) {
    void* base = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(bytes_.data()) + 63) / 64 * 64);
    box = host_moe_mailbox_at(base, layout);
    *box.header = HostMoeMailboxHeader{};
  }
  // Posts a request and waits for its answer (at most 30 s).
  bool request(int layer, const std::vector<float>& x, const std::vector<int32_t>& ids, const std::vector<float>& w) {
    const int n = int(x.size() / kD);
    std::copy(x.begin(), x.end(), box.x);
    std::copy(ids.begin(), ids.end(), box.ids);
    std::copy(w.begin(), w.end(), box.weights);
    std::fill(box.y, box.y + n * kD, 123.f);  // must be overwritten
    box.header->layer = layer;
    box.header->n_tokens = n;
    const uint32_t seq = std::atomic_ref<uint32_t>(box.header->request_seq).load() + 1;
    std::atomic_ref<uint32_t>(box.header->request_seq).store(seq, std::memory_order_release);
    const auto t0 = std::chrono::steady_clock::now();
    while (std::atomic_ref<uint32_t>(box.header->done_seq).load(std::memory_order_acquire) != seq)
      if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(30)) return false;
    return true;
  }
  HostMoeMailbox box;

 private:
  std::vector<uint8_t> bytes_;
};

// One layer (experts 1, 3, 4 on the CPU) served by a one-thread worker with `opt`'s other settings.
struct OneLayerWorker {
  explicit OneLayerWorker(uint32_t seed, HostMoeWorkerOptions opt = {}) : gpu(HostMoeMailboxLayout{kMaxTokens, kD, kTopK}) {
    make_layer(layer, seed);
    opt.n_threads = 1;
    worker = std::make_unique<HostMoeWorker>(gpu.box, std::vector<std::vector<Exl3ExpertWeights>>{cpu_part(layer)}, opt);
  }
  Layer layer;
  Gpu gpu;
  std::unique_ptr<HostMoeWorker> worker;  // last: stops before the mailbox goes
};

TEST(HostMoeWorker, AnswersEachRequestWithTheCpuSlots) {
  Layer layers[2];
  make_layer(layers[0], 1), make_layer(layers[1], 2);
  const HostMoeMailboxLayout layout{kMaxTokens, kD, kTopK};
  Gpu gpu(layout);
  HostMoeWorkerOptions opt;
  opt.n_threads = 2, opt.swiglu_limit = 7.f, opt.spin_us = 500, opt.idle_sleep_us = 200;
  HostMoeWorker worker(gpu.box, {cpu_part(layers[0]), cpu_part(layers[1])}, opt);

  ThreadPool same_threads(2);  // the k-slices follow the thread count: the worker's, for identical sums
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0, 1);
  for (int r = 0; r < 6; ++r) {
    const int layer = r % 2, n = 1 + r;
    std::vector<float> x(n * kD), w(n * kTopK);
    std::vector<int32_t> ids(n * kTopK);
    for (auto& v : x) v = nd(rng);
    for (auto& v : w) v = 0.2f + 0.3f * std::fabs(nd(rng));
    for (int i = 0; i < n * kTopK; ++i) ids[i] = (i * 5 + r) % 7 - 1;  // -1: a slot the GPU keeps
    std::vector<int32_t> cpu_ids = ids;
    for (auto& e : cpu_ids)
      if (e != 1 && e != 3 && e != 4) e = -1;
    if (r == 4) std::this_thread::sleep_for(std::chrono::milliseconds(5));  // past the spin: the worker sleeps
    ASSERT_TRUE(gpu.request(layer, x, cpu_ids, w)) << "request " << r << " not answered";
    std::vector<float> want(n * kD, 0.f);
    exl3_moe_cpu(layers[layer].all.data(), kExperts, x.data(), n, cpu_ids.data(), w.data(), kTopK, 7.f, want.data(),
                 &same_threads);
    int used = 0;
    for (int32_t e : cpu_ids) used += e >= 0;
    ASSERT_GT(used, 0) << "request " << r << " routes nothing to the CPU";
    double norm = 0;
    for (int i = 0; i < n * kD; ++i) {
      ASSERT_EQ(gpu.box.y[i], want[i]) << "request " << r << " value " << i;
      norm += std::fabs(want[i]);
    }
    EXPECT_GT(norm, 0);
  }
  EXPECT_EQ(worker.requests_served(), 6u);
  EXPECT_EQ(worker.bad_requests(), 0u);
}

// The worker passes its kernel options through: with the approximate int16 activations its answers are
// exl3_moe_cpu's with the same options, bit for bit (and not the exact kernel's).
TEST(HostMoeWorker, TheKernelOptionsReachTheKernel) {
  HostMoeWorkerOptions opt;
  opt.kernel.activations = Exl3Activations::kInt16;
  OneLayerWorker w1(4, opt);
  const Layer& layer = w1.layer;
  Gpu& gpu = w1.gpu;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> x(2 * kD), w(2 * kTopK, 0.4f);
  for (auto& v : x) v = nd(rng);
  const std::vector<int32_t> ids = {1, 3, -1, 4, -1, 1};
  ASSERT_TRUE(gpu.request(0, x, ids, w));
  ThreadPool same_threads(1);
  std::vector<float> want(2 * kD, 0.f), exact(2 * kD, 0.f);
  exl3_moe_cpu(layer.all.data(), kExperts, x.data(), 2, ids.data(), w.data(), kTopK, 0.f, want.data(), &same_threads,
               opt.kernel);
  exl3_moe_cpu(layer.all.data(), kExperts, x.data(), 2, ids.data(), w.data(), kTopK, 0.f, exact.data(), &same_threads);
  bool differs_from_exact = false;
  for (int i = 0; i < 2 * kD; ++i) {
    ASSERT_EQ(gpu.box.y[i], want[i]) << i;
    differs_from_exact |= want[i] != exact[i];
  }
  // Where the machine has no int16 kernel the options fall back to the exact one, and there is nothing to tell apart.
  if (detail::exl3_int16_ready()) EXPECT_TRUE(differs_from_exact);
}

TEST(HostMoeWorker, AnExpertItDoesNotHoldGetsZerosAndServingGoesOn) {
  OneLayerWorker w1(3);
  const Layer& layer = w1.layer;
  Gpu& gpu = w1.gpu;
  const HostMoeWorker& worker = *w1.worker;
  std::vector<float> x(kD, 0.5f), w(kTopK, 0.3f);
  ASSERT_TRUE(gpu.request(0, x, {0, -1, -1}, w));  // expert 0 is on the GPU: a poster's bug
  for (int i = 0; i < kD; ++i) ASSERT_EQ(gpu.box.y[i], 0.f);
  ASSERT_TRUE(gpu.request(5, x, {1, -1, -1}, w));  // no layer 5
  EXPECT_EQ(worker.bad_requests(), 2u);
  ASSERT_TRUE(gpu.request(0, x, {1, -1, -1}, w));
  std::vector<float> want(kD, 0.f);
  const int32_t ids[] = {1, -1, -1};
  ThreadPool same_threads(1);
  exl3_moe_cpu(layer.all.data(), kExperts, x.data(), 1, ids, w.data(), kTopK, 0.f, want.data(), &same_threads);
  for (int i = 0; i < kD; ++i) ASSERT_EQ(gpu.box.y[i], want[i]);
  EXPECT_EQ(worker.bad_requests(), 2u);
  EXPECT_EQ(worker.requests_served(), 3u);
}

}  // namespace
}  // namespace spw
#endif
