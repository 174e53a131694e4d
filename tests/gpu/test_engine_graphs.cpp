// CUDA graphs for decode steps (engine/step_graphs.h) on the golden tiny configs
// (tests/golden/fixtures/{v4,v41}): the same decode run twice, once with every kernel launched directly
// and once recorded into graphs and replayed, must give bit-identical logits and tokens at every step.
// Why exact: a graph runs the same kernels with the same arguments in the same stream order; any
// difference means a segment replayed stale arguments (an update that did not take) or read staging bytes
// that had been overwritten.
// The run has 3 sequences with different prompt lengths for 40 steps, so their compressors emit entries
// at different steps and kernels with a zero count are left out of some steps (the topology changes the
// graph cache keys on), then continues with 2 of them (another batch size). Asserted besides: graphs were
// launched, most segments were updates of an existing graph (not one instantiation per segment), and a
// model with the host MoE dispatch (a host round trip inside the step) records nothing. Then StepGraphs alone:
// updated operands are replayed, and an invalidated recording is an error that leaves the stream usable.
#if defined(SPW_HAVE_CUDA)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../golden/golden_fixture.h"
#include "engine/gpu_model.h"
#include "engine/step_graphs.h"
#include "gpu_test_util.h"

namespace spw {
namespace {

std::unique_ptr<engine::GpuModel> load(const std::string& arch, bool graphs,
                                       engine::MoeDispatch dispatch = engine::MoeDispatch::kAuto) {
  engine::GpuModelOptions opts;
  opts.budget.max_context = 1024;
  opts.budget.max_seqs = 4;
  opts.cuda_graphs = graphs;
  opts.moe_dispatch = dispatch;
  auto m = engine::load_gpu_model(golden::fixture_dir(arch) + "/model", Numerics::reference(), opts);
  if (!m.ok()) ADD_FAILURE() << arch << ": " << m.error().message;
  return m.ok() ? std::move(m.value()) : nullptr;
}

std::vector<int32_t> tokens(int n, uint64_t seed, int vocab) { return gpu_test::lcg_tokens(n, seed, vocab); }

// Prefills three sequences, then decodes `steps` steps with all three and `steps_b2` with the first two,
// feeding back the greedy tokens; returns every step's logits, concatenated.
std::vector<float> run(engine::GpuModel& m, int steps, int steps_b2) {
  const int V = int(m.config().vocab_size);
  const std::vector<int> prompt_lens{3, 18, 61};
  std::vector<engine::GpuSequence> seqs;
  std::vector<int32_t> last;
  for (size_t i = 0; i < prompt_lens.size(); ++i) {
    auto s = m.new_sequence();
    EXPECT_TRUE(s.ok()) << s.error().message;
    if (!s.ok()) return {};
    seqs.push_back(std::move(s.value()));
    auto r = m.forward(seqs.back(), tokens(prompt_lens[i], 5 + i, V));
    EXPECT_TRUE(r.ok()) << r.error().message;
    if (!r.ok()) return {};
    last.push_back(int32_t(std::max_element(r->begin(), r->end()) - r->begin()));
  }
  std::vector<float> all;
  for (int t = 0; t < steps + steps_b2; ++t) {
    const size_t B = t < steps ? 3 : 2;
    std::vector<engine::GpuSequence*> ptrs;
    for (size_t i = 0; i < B; ++i) ptrs.push_back(&seqs[i]);
    std::vector<int32_t> in(last.begin(), last.begin() + B), next(B, -1);
    std::vector<float> logits;
    Status st = m.decode(ptrs, in, next, &logits);
    EXPECT_TRUE(st.ok()) << "step " << t << ": " << st.error().message;
    if (!st.ok()) return {};
    all.insert(all.end(), logits.begin(), logits.end());
    std::copy(next.begin(), next.end(), last.begin());
  }
  return all;
}

void graphs_vs_direct(const std::string& arch) {
  SPW_REQUIRE_GPU();
  constexpr int kSteps = 40, kStepsB2 = 8;
  auto direct = load(arch, false);
  auto graphed = load(arch, true);
  ASSERT_TRUE(direct && graphed);
  const std::vector<float> a = run(*direct, kSteps, kStepsB2);
  const std::vector<float> b = run(*graphed, kSteps, kStepsB2);
  ASSERT_FALSE(a.empty());
  ASSERT_EQ(a.size(), b.size());
  const int V = int(direct->config().vocab_size);
  for (size_t row = 0; row < a.size() / V; ++row) {
    if (std::memcmp(a.data() + row * V, b.data() + row * V, sizeof(float) * V) != 0) {
      size_t i = 0;
      while (a[row * V + i] == b[row * V + i]) ++i;
      FAIL() << arch << ": logit row " << row << " differs with graphs (first at " << i << ": direct "
             << a[row * V + i] << ", graphs " << b[row * V + i] << ")";
    }
  }
  EXPECT_EQ(direct->graph_stats().segments, 0);
  const engine::StepGraphStats g = graphed->graph_stats();
  const int64_t per_step = graphed->config().n_layers + 1;  // embedding + layer 0, layers 1.., head
  EXPECT_EQ(g.segments, per_step * (kSteps + kStepsB2));
  EXPECT_EQ(g.segments, g.updates + g.instantiations);
  EXPECT_GT(g.updates, g.segments / 2) << "most segments should update an existing graph";
  std::printf("  [graphs %s] %lld segments: %lld updates, %lld instantiations; %.1f µs of host time per step\n",
              arch.c_str(), (long long)g.segments, (long long)g.updates, (long long)g.instantiations,
              g.record_us / (kSteps + kStepsB2));
}

TEST(EngineGraphs, V4DecodeMatchesDirectLaunches) { graphs_vs_direct("v4"); }
TEST(EngineGraphs, V41DecodeMatchesDirectLaunches) { graphs_vs_direct("v41"); }

TEST(EngineGraphs, HostMoeDispatchRecordsNothing) {
  SPW_REQUIRE_GPU();
  auto m = load("v41", true, engine::MoeDispatch::kHost);
  ASSERT_TRUE(m);
  const std::vector<float> logits = run(*m, 2, 0);
  EXPECT_FALSE(logits.empty());
  EXPECT_EQ(m->graph_stats().segments, 0);
}

// StepGraphs on its own: a second recording of the same shape with other operands updates the graph in place
// and the replay uses the new operands; a recording that a synchronisation invalidated reports an error and
// leaves the stream usable.
// A stream and a 64-byte device buffer for the StepGraphs tests.
class EngineGraphsStandalone : public testing::Test {
 protected:
  void SetUp() override {
    SPW_REQUIRE_GPU();
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&d, kBytes), cudaSuccess);
  }
  void TearDown() override {
    if (d) cudaFree(d);
    if (stream) cudaStreamDestroy(stream);
  }
  // The buffer's bytes, after the stream's work so far.
  std::vector<uint8_t> read_back() {
    std::vector<uint8_t> host(kBytes);
    EXPECT_EQ(cudaMemcpyAsync(host.data(), d, kBytes, cudaMemcpyDeviceToHost, stream), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    return host;
  }
  static constexpr size_t kBytes = 64;
  cudaStream_t stream = nullptr;
  uint8_t* d = nullptr;
  engine::StepGraphs graphs;
};

TEST_F(EngineGraphsStandalone, UpdateReplaysTheNewOperands) {
  for (int value : {1, 2, 3}) {
    ASSERT_TRUE(graphs.begin_segment(stream, 1, 0).ok());
    ASSERT_EQ(cudaMemsetAsync(d, value, kBytes, stream), cudaSuccess);
    Status st = graphs.end_segment();
    ASSERT_TRUE(st.ok()) << st.error().message;
    for (uint8_t b : read_back()) ASSERT_EQ(b, value) << "the replay used stale operands";
  }
  EXPECT_EQ(graphs.stats().segments, 3);
  EXPECT_EQ(graphs.stats().instantiations, 1);
  EXPECT_EQ(graphs.stats().updates, 2);
  EXPECT_EQ(graphs.graph_count(), 1u);
}

TEST_F(EngineGraphsStandalone, InvalidatedRecordingIsAnErrorAndTheStreamStaysUsable) {
  ASSERT_TRUE(graphs.begin_segment(stream, 1, 0).ok());
  ASSERT_EQ(cudaMemsetAsync(d, 7, kBytes, stream), cudaSuccess);
  EXPECT_NE(cudaStreamSynchronize(stream), cudaSuccess);  // not allowed while recording: invalidates it
  cudaGetLastError();
  Status st = graphs.end_segment();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("capture"), std::string::npos) << st.error().message;
  EXPECT_FALSE(graphs.recording());
  EXPECT_EQ(graphs.stats().segments, 0);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the failed capture's error was left for the next launch check to find";
  ASSERT_EQ(cudaMemsetAsync(d, 9, kBytes, stream), cudaSuccess);
  for (uint8_t b : read_back()) ASSERT_EQ(b, 9);
}

}  // namespace
}  // namespace spw
#endif
