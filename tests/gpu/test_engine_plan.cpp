// The GPU memory planner (engine/memory_plan.h): KV bytes per token and pool pages worked out by
// hand from the row formats of cuda/attn/kv_pages.h for the golden V4.1 and V4 configs, pools that
// grow with the budget, and (on the GPU) the weights actually uploaded are within the plan's
// upper bound. Exact integer arithmetic: no tolerance.
// In spw_gpu_tests because the planner uses kv_pages.h (CUDA headers); only the last test needs a GPU.
#if defined(SPW_HAVE_CUDA)
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "gpu_test_util.h"
#include "engine/gpu_model.h"
#include "engine/memory_plan.h"

namespace spw {
namespace {

std::string model_dir(const std::string& arch) {
  return std::string(SPW_SOURCE_DIR) + "/tests/golden/fixtures/" + arch + "/model";
}

ModelConfig config(const std::string& arch) {
  auto c = read_model_config(model_dir(arch));
  EXPECT_TRUE(c.ok()) << c.error().message;
  return c.ok() ? c.value() : ModelConfig{};
}

TEST(EnginePlan, V41KvBytesByHand) {
  const ModelConfig c = config("v41");
  ASSERT_EQ(c.d_head, 128);
  ASSERT_EQ(c.index_head_dim, 128);
  // KV sources: layers 2 and 4 (ratio 2) and 6 (ratio 1). Compressed row: 128 fp4 = 64 B + 8 e4m3
  // scales = 72 B; index key: 64 B + 4 ue8m0 scales = 68 B. Per token: (72+68)/2·2 + (72+68)/1.
  engine::KvBudget b{3, 1000, 64};
  const engine::MemoryPlan p = engine::plan_memory(c, b);
  EXPECT_DOUBLE_EQ(p.kv.nbytes_per_token, 280.0);
  EXPECT_EQ(p.kv.compressed_page_nbytes, 72u * 64);
  EXPECT_EQ(p.kv.index_key_page_nbytes, 68u * 64);
  // Window row: 128 fp8 + 4 ue8m0 = 132 B; two 64-row pages per layer and sequence.
  EXPECT_EQ(p.kv.ring_page_nbytes, 132u * 64);
  EXPECT_EQ(p.kv.ring_pages, 3 * c.n_layers * 2);
  // 1000 positions: ratio 2 → 500 entries → 8 pages; ratio 1 → 1000 → 16 pages; 3 sequences.
  EXPECT_EQ(p.kv.compressed_pages, 3 * (8 + 8 + 16));
  EXPECT_EQ(p.kv.index_key_pages, 3 * (8 + 8 + 16));
  EXPECT_EQ(p.max_pages_per_seq, 16);
}

TEST(EnginePlan, V4KvBytesByHand) {
  const ModelConfig c = config("v4");
  ASSERT_EQ(c.d_head, 128);
  ASSERT_EQ(c.d_rope, 64);
  // Layers 1, 3: CSA ratio 4 (entries + index keys); 2, 4: HCA ratio 128 (entries only).
  // V4 row: 64 fp8 + 64 RoPE channels bf16 (128 B) + 1 ue8m0 scale = 193 → 196 B (4-byte pad).
  engine::KvBudget b{1, 1024, 64};
  const engine::MemoryPlan p = engine::plan_memory(c, b);
  EXPECT_EQ(p.kv.compressed_page_nbytes, 196u * 64);
  EXPECT_EQ(p.kv.ring_page_nbytes, 196u * 64);
  EXPECT_DOUBLE_EQ(p.kv.nbytes_per_token, 2 * (196.0 / 4 + 68.0 / 4) + 2 * (196.0 / 128));
  // 1024 positions: ratio 4 → 256 entries → 4 pages; ratio 128 → 8 entries → 1 page.
  EXPECT_EQ(p.kv.compressed_pages, 4 + 1 + 4 + 1);
  EXPECT_EQ(p.kv.index_key_pages, 4 + 4);
}

// Without fake quant (Numerics::exact()) every pool row is d f32 channels: 128·4 = 512 B for the golden
// models' heads and index keys; the page counts do not change.
TEST(EnginePlan, ExactKvRowsAreF32) {
  const ModelConfig c = config("v41");
  engine::KvBudget b{3, 1000, 64};
  const engine::MemoryPlan q = engine::plan_memory(c, b);
  const engine::MemoryPlan p = engine::plan_memory(c, b, /*quantized_kv=*/false);
  EXPECT_EQ(p.kv.ring_page_nbytes, 512u * 64);
  EXPECT_EQ(p.kv.compressed_page_nbytes, 512u * 64);
  EXPECT_EQ(p.kv.index_key_page_nbytes, 512u * 64);
  EXPECT_DOUBLE_EQ(p.kv.nbytes_per_token, (512.0 + 512.0) / 2 * 2 + (512.0 + 512.0));
  EXPECT_EQ(p.kv.ring_pages, q.kv.ring_pages);
  EXPECT_EQ(p.kv.compressed_pages, q.kv.compressed_pages);
  EXPECT_EQ(p.kv.index_key_pages, q.kv.index_key_pages);
  const engine::KvFormats f = engine::kv_formats(c, false);
  EXPECT_EQ(f.ring.elem, cuda::KvElem::kF32);
  EXPECT_EQ(cuda::kv_row_channels(f.index_key), c.index_head_dim);
}

TEST(EnginePlan, GrowsWithTheBudget) {
  for (const char* arch : {"v41", "v4"}) {
    const ModelConfig c = config(arch);
    const engine::MemoryPlan small = engine::plan_memory(c, {1, 4096, 64});
    const engine::MemoryPlan big = engine::plan_memory(c, {4, 4096, 512});
    EXPECT_EQ(big.weights.total(), small.weights.total()) << arch;
    EXPECT_EQ(big.kv.pool_nbytes(), 4 * small.kv.pool_nbytes()) << arch;
    EXPECT_GT(big.workspace_nbytes, small.workspace_nbytes) << arch;
    EXPECT_GT(small.weights.routed_experts, 0u) << arch;
    EXPECT_EQ(small.engram_tables_host_nbytes > 0, std::string(arch) == "v41") << arch;
  }
}

TEST(EnginePlan, UploadedWeightsWithinPlan) {
  SPW_REQUIRE_GPU();
  for (const char* arch : {"v41", "v4"}) {
    auto m = engine::load_gpu_model(model_dir(arch), Numerics::reference(), {});
    ASSERT_TRUE(m.ok()) << m.error().message;
    const engine::MemoryPlan& p = (*m)->plan();
    std::printf("  [plan %s] weights: planned %zu B, uploaded %zu B; KV %.1f B/token, pools %zu B, workspace %zu B\n",
                arch, p.weights.total(), (*m)->weight_nbytes(), p.kv.nbytes_per_token, p.kv.pool_nbytes(),
                p.workspace_nbytes);
    EXPECT_LE((*m)->weight_nbytes(), p.weights.total()) << arch;
    EXPECT_GE((*m)->weight_nbytes(), p.weights.total() / 2) << arch;
  }
}

// What a user can exceed is an error, not a crash: a second sequence beyond max_seqs, a chunk
// beyond max_step_tokens, a context beyond max_context; a freed slot is usable again.
TEST(EnginePlan, BudgetLimitsAreErrors) {
  SPW_REQUIRE_GPU();
  engine::GpuModelOptions opts;
  opts.budget = {1, 8, 4};
  auto m = engine::load_gpu_model(model_dir("v41"), Numerics::reference(), opts);
  ASSERT_TRUE(m.ok()) << m.error().message;
  auto a = (*m)->new_sequence();
  ASSERT_TRUE(a.ok()) << a.error().message;
  EXPECT_FALSE((*m)->new_sequence().ok());
  const std::vector<int32_t> five{5, 6, 7, 8, 9}, four{5, 6, 7, 8}, bad{int32_t((*m)->config().vocab_size)};
  EXPECT_FALSE((*m)->forward(*a, five).ok());
  EXPECT_FALSE((*m)->forward(*a, bad).ok());
  EXPECT_EQ(a->n_past, 0);
  ASSERT_TRUE((*m)->forward(*a, four).ok());
  ASSERT_TRUE((*m)->forward(*a, four).ok());
  EXPECT_FALSE((*m)->forward(*a, std::vector<int32_t>{1}).ok());  // position 8 of an 8-position budget
  (*m)->free_sequence(*a);
  EXPECT_TRUE((*m)->new_sequence().ok());
}

}  // namespace
}  // namespace spw
#endif  // SPW_HAVE_CUDA
