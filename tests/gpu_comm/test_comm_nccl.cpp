// The NCCL backend of comm/communicator.h on every visible GPU (one rank per device, one thread per rank,
// as the engine drives them): each collective against its definition. Inputs are small integers, so every
// sum is exact whatever order NCCL adds in. On a one-GPU machine the group has one rank (the calls, the
// streams and the result copies are still exercised); the multi-GPU kinds run the real exchanges.
// Its own binary (spw_gpu_comm_tests), the only one that needs libnccl where it runs: stage it with
// STAGE_BINS="tests/spw_gpu_comm_tests" (scripts/gpu_test.sh) and put the machine's libnccl.so.2 on
// LD_LIBRARY_PATH (the CUDA toolkit's lib/, or the nvidia/nccl/lib of the Python environment's torch).
#if defined(SPW_HAVE_CUDA)
#include <gtest/gtest.h>

#include <numeric>
#include <thread>

#include "comm/nccl_communicator.h"
#include "../gpu/gpu_test_util.h"

namespace spw::comm {
namespace {

std::vector<float> device_roundtrip(cudaStream_t stream, const std::vector<float>& host, float*& dev) {
  cudaMalloc(&dev, std::max<size_t>(host.size(), 1) * sizeof(float));
  cudaMemcpyAsync(dev, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice, stream);
  return host;
}

std::vector<float> download(cudaStream_t stream, const float* dev, size_t n) {
  std::vector<float> out(n);
  cudaMemcpyAsync(out.data(), dev, n * sizeof(float), cudaMemcpyDeviceToHost, stream);
  cudaStreamSynchronize(stream);
  return out;
}

TEST(NcclComm, CollectivesOnEveryVisibleGpu) {
  SPW_REQUIRE_GPU();
  int n_dev = 0;
  ASSERT_EQ(cudaGetDeviceCount(&n_dev), cudaSuccess);
  const int size = std::min(n_dev, 8);
  std::vector<int> devices(static_cast<size_t>(size));
  std::iota(devices.begin(), devices.end(), 0);
  std::vector<cudaStream_t> streams(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    cudaSetDevice(r);
    ASSERT_EQ(cudaStreamCreate(&streams[size_t(r)]), cudaSuccess);
  }
  auto group = make_nccl_group(devices, streams);
  ASSERT_TRUE(group.ok()) << group.error().message;
  std::printf("[ measured ] NCCL group of %d rank(s)\n", size);
  constexpr size_t n = 4096;
  const auto value = [](int r, size_t i) { return float(int(i % 97) - 48 + r); };
  std::vector<std::thread> threads;
  std::vector<int> ok(static_cast<size_t>(size), 0);
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      cudaSetDevice(r);
      Communicator& c = *(*group)[size_t(r)];
      cudaStream_t s = streams[size_t(r)];
      std::vector<float> in(n), big(n * static_cast<size_t>(size));
      for (size_t i = 0; i < n; ++i) in[i] = value(r, i);
      for (size_t i = 0; i < big.size(); ++i) big[i] = value(r, i);
      float *d_in, *d_big, *d_out, *d_gather, *d_block;
      device_roundtrip(s, in, d_in);
      device_roundtrip(s, big, d_big);
      cudaMalloc(&d_out, n * sizeof(float));
      cudaMalloc(&d_gather, n * size_t(size) * sizeof(float));
      cudaMalloc(&d_block, n * sizeof(float));
      bool good = c.rank() == r && c.size() == size && c.backend() == "nccl";
      good &= c.all_reduce(d_in, d_out, n).ok() && c.all_gather(d_in, n, d_gather).ok() &&
              c.reduce_scatter(d_big, n, d_block).ok();
      const auto sum = download(s, d_out, n), gathered = download(s, d_gather, n * size_t(size));
      const auto block = download(s, d_block, n);
      for (size_t i = 0; i < n; ++i) {
        float want = 0, want_block = 0;
        for (int j = 0; j < size; ++j) want += value(j, i), want_block += value(j, size_t(r) * n + i);
        good &= sum[i] == want && block[i] == want_block;
        for (int j = 0; j < size; ++j) good &= gathered[size_t(j) * n + i] == value(j, i);
      }
      // All-to-all: (r + 1)·(j + 1) floats from rank r to rank j, valued from·1000 + to.
      std::vector<size_t> send(static_cast<size_t>(size)), recv(static_cast<size_t>(size));
      std::vector<float> a2a;
      for (int j = 0; j < size; ++j) {
        send[size_t(j)] = size_t((r + 1) * (j + 1)), recv[size_t(j)] = size_t((j + 1) * (r + 1));
        a2a.insert(a2a.end(), send[size_t(j)], float(r * 1000 + j));
      }
      float *d_a2a, *d_recv;
      device_roundtrip(s, a2a, d_a2a);
      const size_t total = std::accumulate(recv.begin(), recv.end(), size_t(0));
      cudaMalloc(&d_recv, total * sizeof(float));
      good &= c.all_to_all(d_a2a, send, d_recv, recv).ok();
      const auto got = download(s, d_recv, total);
      size_t at = 0;
      for (int j = 0; j < size; ++j)
        for (size_t i = 0; i < recv[size_t(j)]; ++i) good &= got[at++] == float(j * 1000 + r);
      for (float* p : {d_in, d_big, d_out, d_gather, d_block, d_a2a, d_recv}) cudaFree(p);
      ok[size_t(r)] = good;
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < size; ++r) EXPECT_TRUE(ok[size_t(r)]) << "rank " << r;
  group->clear();
  for (cudaStream_t s : streams) cudaStreamDestroy(s);
}

}  // namespace
}  // namespace spw::comm
#endif
