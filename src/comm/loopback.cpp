#include "comm/loopback.h"

#include <barrier>
#include <cstring>
#include <numeric>

namespace spw::comm {
namespace {

// What each rank posts for the collective in progress: its buffers and counts, read by the others
// between the two barriers.
struct Posting {
  const float* in = nullptr;
  std::span<const size_t> send_counts, recv_counts;
};

struct Shared {
  explicit Shared(int size) : size(size), posts(size_t(size)), sync(size) {}
  const int size;
  std::vector<Posting> posts;
  std::barrier<> sync;
};

class LoopbackCommunicator final : public Communicator {
 public:
  LoopbackCommunicator(std::shared_ptr<Shared> shared, int rank) : shared_(std::move(shared)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return shared_->size; }
  std::string_view backend() const override { return "loopback"; }

  Status all_reduce(const float* in, float* out, size_t n) override {
    // Each rank computes its output from everyone's input; inputs stay untouched until all have read
    // them, since out may alias in.
    return collective(Posting{in, {}, {}}, [&](const std::vector<Posting>& all) {
      for (size_t i = 0; i < n; ++i) {
        float s = all[0].in[i];
        for (int r = 1; r < size(); ++r) s += all[size_t(r)].in[i];
        scratch_.push_back(s);
      }
    }, out, n);
  }

  Status all_gather(const float* in, size_t n, float* out) override {
    return collective(Posting{in, {}, {}}, [&](const std::vector<Posting>& all) {
      for (int r = 0; r < size(); ++r) scratch_.insert(scratch_.end(), all[size_t(r)].in, all[size_t(r)].in + n);
    }, out, n * size_t(size()));
  }

  Status reduce_scatter(const float* in, size_t n, float* out) override {
    return collective(Posting{in, {}, {}}, [&](const std::vector<Posting>& all) {
      const size_t base = size_t(rank_) * n;
      for (size_t i = 0; i < n; ++i) {
        float s = all[0].in[base + i];
        for (int r = 1; r < size(); ++r) s += all[size_t(r)].in[base + i];
        scratch_.push_back(s);
      }
    }, out, n);
  }

  Status all_to_all(const float* in, std::span<const size_t> send_counts, float* out,
                    std::span<const size_t> recv_counts) override {
    if (send_counts.size() != size_t(size()) || recv_counts.size() != size_t(size()))
      return make_error("all_to_all: ", send_counts.size(), " send and ", recv_counts.size(), " receive counts for ",
                        size(), " ranks");
    Status mismatch;
    const size_t total = std::accumulate(recv_counts.begin(), recv_counts.end(), size_t(0));
    SPW_TRY(collective(Posting{in, send_counts, recv_counts}, [&](const std::vector<Posting>& all) {
      for (int j = 0; j < size(); ++j) {
        const Posting& from = all[size_t(j)];
        if (from.send_counts[size_t(rank_)] != recv_counts[size_t(j)]) {
          mismatch = make_error("all_to_all: rank ", j, " sends ", from.send_counts[size_t(rank_)], " floats to rank ",
                                rank_, ", which expects ", recv_counts[size_t(j)]);
          return;
        }
        const size_t offset = std::accumulate(from.send_counts.begin(), from.send_counts.begin() + rank_, size_t(0));
        scratch_.insert(scratch_.end(), from.in + offset, from.in + offset + recv_counts[size_t(j)]);
      }
    }, out, total));
    return mismatch;
  }

 private:
  // Posts this rank's part, waits for every rank, computes this rank's result into scratch (reading the
  // others' inputs), waits again (so no input is overwritten while another rank still reads it), and
  // writes the result to out[0 .. out_n).
  template <class Compute>
  Status collective(Posting mine, Compute&& compute, float* out, size_t out_n) {
    shared_->posts[size_t(rank_)] = mine;
    shared_->sync.arrive_and_wait();
    scratch_.clear();
    compute(shared_->posts);
    shared_->sync.arrive_and_wait();
    if (scratch_.size() == out_n && out_n > 0) std::memcpy(out, scratch_.data(), out_n * sizeof(float));
    return {};
  }

  std::shared_ptr<Shared> shared_;
  int rank_;
  std::vector<float> scratch_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_loopback_group(int size) {
  auto shared = std::make_shared<Shared>(size);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < size; ++r) out.push_back(std::make_unique<LoopbackCommunicator>(shared, r));
  return out;
}

}  // namespace spw::comm
