// Image positions in the GPU forward (model/image_positions.h; the CPU reference does the same in
// model/model.cpp, moe.cpp and engram.cpp): a step's image positions are a few runs of rows, so each
// piece is a handful of copies or one extra router launch rather than per-row branches in the kernels.
#include <cuda_runtime.h>

#include "cuda/ops/moe.h"
#include "engine/gpu_step.h"
#include "formats/dtypes.h"

namespace spw::engine {

void plan_image_rows(GpuStep& s) {
  s.image_runs.clear();
  s.image_rows.clear();
  for (const StepChunk& ch : s.chunks) {
    if (ch.images.empty()) continue;
    size_t k = 0;  // the chunk's next image row
    for (int i = 0; i < ch.n; ++i) {
      if (!ch.images.is_image[size_t(i)]) continue;
      const int row = ch.row0 + i;
      if (!s.image_runs.empty() && s.image_runs.back().first + s.image_runs.back().n == row) {
        ++s.image_runs.back().n;
      } else {
        s.image_runs.push_back({row, 1, int(s.image_rows.size() / size_t(s.c.d_model))});
      }
      const float* src = ch.images.rows.data() + k++ * size_t(s.c.d_model);
      for (int j = 0; j < s.c.d_model; ++j) s.image_rows.push_back(s.num.bf16_activations ? round_bf16(src[j]) : src[j]);
    }
  }
}

Status embed_image_rows(GpuStep& s, float* streams) {
  if (s.image_runs.empty()) return {};
  const size_t d = size_t(s.c.d_model), hc = size_t(s.c.hc_mult);
  DeviceSpan<float> rows;
  SPW_TRY(s.upload(s.image_rows, rows));
  for (const ImageRun& r : s.image_runs)
    for (size_t j = 0; j < hc; ++j)  // each run's rows into copy j of the streams [n, hc, d]
      SPW_CUDA_TRY(cudaMemcpy2DAsync(streams + (size_t(r.first) * hc + j) * d, hc * d * sizeof(float),
                                     rows.get() + size_t(r.source) * d, d * sizeof(float), d * sizeof(float),
                                     size_t(r.n), cudaMemcpyDeviceToDevice, s.stream));
  return {};
}

Status route_image_rows(GpuStep& s, int layer, const float* logits, float route_eps, int32_t* experts,
                        float* weights) {
  if (s.image_runs.empty()) return {};
  const DeviceLayer& lw = s.w.layers[layer];
  if (!lw.gate_bias_vl) return make_error("layer ", layer, " has no bias_vl for its image positions");
  const int n = s.n, E = s.c.n_experts, K = s.c.top_k;
  DeviceSpan<int32_t> vl_experts;
  DeviceSpan<float> vl_weights;
  SPW_TRY(s.alloc(vl_experts, size_t(n) * K));
  SPW_TRY(s.alloc(vl_weights, size_t(n) * K));
  SPW_TRY(cuda::router_topk(logits, lw.gate_bias_vl, n, E, K, route_eps, s.c.route_scale, vl_experts.get(),
                            vl_weights.get(), s.stream));
  for (const ImageRun& r : s.image_runs) {
    const size_t at = size_t(r.first) * K, count = size_t(r.n) * K;
    SPW_CUDA_TRY(cudaMemcpyAsync(experts + at, vl_experts.get() + at, count * sizeof(int32_t), cudaMemcpyDeviceToDevice,
                                 s.stream));
    SPW_CUDA_TRY(cudaMemcpyAsync(weights + at, vl_weights.get() + at, count * sizeof(float), cudaMemcpyDeviceToDevice,
                                 s.stream));
  }
  return {};
}

Status mute_engram_values(GpuStep& s, float* kv) {
  const size_t d = size_t(s.c.d_model), width = (size_t(s.c.hc_mult) + 1) * d;
  for (const ImageRun& r : s.image_runs)  // the value is the last d of each row's (hc + 1)·d
    SPW_CUDA_TRY(cudaMemset2DAsync(kv + size_t(r.first) * width + width - d, width * sizeof(float), 0,
                                   d * sizeof(float), size_t(r.n), s.stream));
  return {};
}

}  // namespace spw::engine
