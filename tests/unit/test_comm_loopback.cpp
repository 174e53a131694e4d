// The loopback backend of comm/communicator.h: every collective, on groups of 1 to 4 ranks each driven by
// its own thread, against the same result computed directly (sums in rank order, so bit-exact), many
// collectives in a row of changing sizes, and count mismatches refused.
#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <thread>

#include "comm/loopback.h"

namespace spw::comm {
namespace {

// Runs body(rank, communicator) on one thread per rank of a new loopback group.
template <class Body>
void on_every_rank(int size, Body body) {
  auto group = make_loopback_group(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back([&, r] { body(r, *group[size_t(r)]); });
  for (auto& t : threads) t.join();
}

std::vector<float> values(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

TEST(CommLoopback, CollectivesEqualTheirDefinition) {
  for (int size : {1, 2, 3, 4}) {
    constexpr size_t n = 1000;
    std::vector<std::vector<float>> in(static_cast<size_t>(size)), big(static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) in[size_t(r)] = values(n, 10 + r), big[size_t(r)] = values(n * size_t(size), 20 + r);
    std::vector<float> sum(n, 0.f), big_sum(n * size_t(size), 0.f);
    for (int r = 0; r < size; ++r)
      for (size_t i = 0; i < n; ++i) sum[i] = r == 0 ? in[0][i] : sum[i] + in[size_t(r)][i];
    for (int r = 0; r < size; ++r)
      for (size_t i = 0; i < big_sum.size(); ++i) big_sum[i] = r == 0 ? big[0][i] : big_sum[i] + big[size_t(r)][i];
    on_every_rank(size, [&](int r, Communicator& c) {
      EXPECT_EQ(c.rank(), r);
      EXPECT_EQ(c.size(), size);
      std::vector<float> out(n);
      ASSERT_TRUE(c.all_reduce(in[size_t(r)].data(), out.data(), n).ok());
      EXPECT_EQ(out, sum) << "all_reduce, rank " << r << " of " << size;
      std::vector<float> inplace = in[size_t(r)];
      ASSERT_TRUE(c.all_reduce(inplace.data(), inplace.data(), n).ok());
      EXPECT_EQ(inplace, sum) << "in-place all_reduce, rank " << r;
      std::vector<float> gathered(n * size_t(size));
      ASSERT_TRUE(c.all_gather(in[size_t(r)].data(), n, gathered.data()).ok());
      for (int j = 0; j < size; ++j)
        EXPECT_TRUE(std::equal(in[size_t(j)].begin(), in[size_t(j)].end(), gathered.begin() + std::ptrdiff_t(j * n)))
            << "all_gather block " << j << ", rank " << r;
      std::vector<float> block(n);
      ASSERT_TRUE(c.reduce_scatter(big[size_t(r)].data(), n, block.data()).ok());
      EXPECT_TRUE(std::equal(block.begin(), block.end(), big_sum.begin() + std::ptrdiff_t(size_t(r) * n)))
          << "reduce_scatter, rank " << r;
    });
  }
}

// Expert-parallel dispatch: rank r sends (r + 1)·(j + 2) floats to rank j, each tagged with (from, to, index).
TEST(CommLoopback, AllToAllDeliversEveryBlockToItsRank) {
  constexpr int size = 4;
  const auto count = [](int from, int to) { return size_t((from + 1) * (to + 2)); };
  const auto tag = [](int from, int to, size_t i) { return float(from * 100000 + to * 1000 + int(i)); };
  on_every_rank(size, [&](int r, Communicator& c) {
    std::vector<size_t> send(size), recv(size);
    std::vector<float> in;
    for (int j = 0; j < size; ++j) {
      send[size_t(j)] = count(r, j), recv[size_t(j)] = count(j, r);
      for (size_t i = 0; i < send[size_t(j)]; ++i) in.push_back(tag(r, j, i));
    }
    std::vector<float> out(std::accumulate(recv.begin(), recv.end(), size_t(0)));
    ASSERT_TRUE(c.all_to_all(in.data(), send, out.data(), recv).ok());
    size_t at = 0;
    for (int j = 0; j < size; ++j)
      for (size_t i = 0; i < recv[size_t(j)]; ++i, ++at) ASSERT_EQ(out[at], tag(j, r, i)) << "rank " << r << " from " << j;
  });
}

TEST(CommLoopback, ManyCollectivesInARowOfChangingSizes) {
  constexpr int size = 3;
  on_every_rank(size, [&](int r, Communicator& c) {
    for (int step = 0; step < 300; ++step) {
      const size_t n = size_t(1 + (step * 37) % 257);
      std::vector<float> v(n, float(r + step)), out(n);
      ASSERT_TRUE(c.all_reduce(v.data(), out.data(), n).ok());
      const float want = float(0 + step) + float(1 + step) + float(2 + step);
      for (float x : out) ASSERT_EQ(x, want) << "step " << step;
    }
  });
}

TEST(CommLoopback, AllToAllRefusesCountsThatDoNotMatch) {
  constexpr int size = 2;
  std::vector<int> failed(size, 0);
  on_every_rank(size, [&](int r, Communicator& c) {
    const std::vector<size_t> send = {1, 1};
    const std::vector<size_t> recv = r == 1 ? std::vector<size_t>{2, 1} : std::vector<size_t>{1, 1};  // rank 0 sends 1
    std::vector<float> in(2, 1.f), out(3);
    const Status st = c.all_to_all(in.data(), send, out.data(), recv);
    failed[size_t(r)] = !st.ok();
    if (!st.ok()) {
      EXPECT_NE(st.error().message.find("expects"), std::string::npos) << st.error().message;
    }
    std::vector<size_t> wrong(3, 0);
    EXPECT_FALSE(c.all_to_all(in.data(), wrong, out.data(), recv).ok()) << "counts for 3 ranks in a group of 2";
  });
  EXPECT_EQ(failed, (std::vector<int>{0, 1}));
}

}  // namespace
}  // namespace spw::comm
