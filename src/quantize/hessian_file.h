// One layer's calibration Hessians on disk (DST/.quantize-work/hessians/layer-L.safetensors, docs/quantize.md):
// F64 tensors "tokens" [E] (Σ ω of each expert's routed tokens), "layer_tokens" [1], "w2.E" [f, f] per expert,
// and either "w13.E" [d, d] per expert or, with gate/up shared per layer, one "w13" [d, d]. Each is normalized
// and blended as calibration.h describes. Written expert by expert, in expert order, and read memory-mapped one
// expert at a time, so neither side needs the whole layer in memory (≈ 113 GB for a V4.1 layer with per-expert
// gate/up Hessians).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "formats/safetensors.h"
#include "quantize/safetensors_writer.h"

namespace spw::quant {

class LayerHessianWriter {
 public:
  // tokens: Σ ω per expert (its size is the expert count); shared: one gate/up Hessian for the layer.
  static Result<std::unique_ptr<LayerHessianWriter>> create(const std::string& path, int d, int f,
                                                            const std::vector<double>& tokens, double layer_tokens,
                                                            bool shared);
  // Expert `e`'s Hessians, e = 0, 1, … in order; w13 is ignored (may be empty) when shared.
  Status add_expert(int e, const std::vector<double>& w13, const std::vector<double>& w2);
  // After the last expert; shared_w13 is the layer's gate/up Hessian when shared (else ignored).
  Status finish(const std::vector<double>& shared_w13);

 private:
  std::unique_ptr<SafetensorsStreamWriter> out_;
  int d_ = 0, f_ = 0, n_experts_ = 0, next_ = 0;
  bool shared_ = false;
};

class LayerHessianFile {
 public:
  // Checks that every tensor is there with the model's d, f and expert count; errors name the file and say how to
  // recalibrate.
  static Result<LayerHessianFile> open(const std::string& path, int d, int f, int n_experts);

  double tokens(int expert) const { return tokens_[size_t(expert)]; }
  double layer_tokens() const { return layer_tokens_; }
  // Expert `expert`'s Hessian for w1/w3 (down = false) or w2, zero-padded from [n, n] to [k, k] (k ≥ n).
  std::vector<double> padded(int expert, bool down, int64_t k) const;

 private:
  std::unique_ptr<SafetensorsFile> file_;
  int d_ = 0, f_ = 0;
  bool shared_ = false;
  std::vector<double> tokens_;
  double layer_tokens_ = 0;
};

}  // namespace spw::quant
