#include "cpu/host_moe_worker.h"

#include <immintrin.h>

#include <atomic>
#include <chrono>
#include <cstring>

namespace spw {
namespace {

uint32_t load_acquire(uint32_t& word) { return std::atomic_ref<uint32_t>(word).load(std::memory_order_acquire); }
void store_release(uint32_t& word, uint32_t v) { std::atomic_ref<uint32_t>(word).store(v, std::memory_order_release); }

}  // namespace

HostMoeWorker::HostMoeWorker(const HostMoeMailbox& box, std::vector<std::vector<Exl3ExpertWeights>> layers,
                             const HostMoeWorkerOptions& options)
    : box_(box), layers_(std::move(layers)), options_(options),
      pool_(std::make_unique<ThreadPool>(size_t(options.n_threads > 0 ? options.n_threads : 0))) {
  thread_ = std::thread([this] { loop(); });
}

HostMoeWorker::~HostMoeWorker() {
  stop_.store(true, std::memory_order_relaxed);
  thread_.join();
}

void HostMoeWorker::loop() {
  using Clock = std::chrono::steady_clock;
  auto last = Clock::now();
  while (!stop_.load(std::memory_order_relaxed)) {
    const uint32_t seq = load_acquire(box_.header->request_seq);
    if (seq != load_acquire(box_.header->done_seq)) {
      serve(seq);
      last = Clock::now();
      continue;
    }
    if (Clock::now() - last < std::chrono::microseconds(options_.spin_us)) _mm_pause();
    else std::this_thread::sleep_for(std::chrono::microseconds(options_.idle_sleep_us));
  }
}

void HostMoeWorker::serve(uint32_t seq) {
  const auto t0 = std::chrono::steady_clock::now();
  const HostMoeMailboxLayout& L = box_.layout;
  const int layer = box_.header->layer;
  const int64_t n = box_.header->n_tokens, d = L.d, K = L.top_k;
  bool ok = n >= 0 && n <= L.max_tokens && layer >= 0 && layer < int(layers_.size());
  if (ok) std::memset(box_.y, 0, sizeof(float) * size_t(n) * d);
  if (ok) {
    const std::vector<Exl3ExpertWeights>& experts = layers_[layer];
    for (int64_t i = 0; i < n * K && ok; ++i) {
      const int32_t e = box_.ids[i];
      ok = e < int32_t(experts.size()) && (e < 0 || experts[e].w1 != nullptr);
    }
    if (ok)
      exl3_moe_cpu(experts.data(), int64_t(experts.size()), box_.x, n, box_.ids, box_.weights, K,
                   options_.swiglu_limit, box_.y, pool_.get(), options_.kernel);
  }
  if (!ok) {
    bad_.fetch_add(1, std::memory_order_relaxed);
    if (n > 0 && n <= L.max_tokens) std::memset(box_.y, 0, sizeof(float) * size_t(n) * d);
  }
  busy_ns_.fetch_add(uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                  std::chrono::steady_clock::now() - t0).count()),
                     std::memory_order_relaxed);
  served_.fetch_add(1, std::memory_order_relaxed);
  store_release(box_.header->done_seq, seq);
}

}  // namespace spw
