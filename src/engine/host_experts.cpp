#include "engine/host_experts.h"

#include "engine/host_expert_kernels.h"

namespace spw::engine {

Result<std::unique_ptr<HostExperts>> HostExperts::create(const ModelConfig& c, const DeviceWeights& w, int max_tokens,
                                                        const HostExpertOptions& options) {
  if (w.n_experts_in[int(ExpertTier::HostCpu)] == 0) return std::unique_ptr<HostExperts>();
  std::unique_ptr<HostExperts> h(new HostExperts());
  h->options_ = options;
  h->layout_ = HostMoeMailboxLayout{max_tokens, c.d_model, c.top_k};
  SPW_TRY(h->mailbox_.alloc(h->layout_.nbytes()));
  h->host_box_ = host_moe_mailbox_at(h->mailbox_.host_ptr(), h->layout_);
  h->device_box_ = host_moe_mailbox_at(h->mailbox_.device_ptr(), h->layout_);
  h->on_cpu_.resize(c.n_layers);
  std::vector<std::vector<Exl3ExpertWeights>> layers(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::vector<DeviceExpert>& experts = w.layers[l].experts;
    std::vector<uint8_t> mask(experts.size(), 0);
    bool any = false;
    for (size_t e = 0; e < experts.size(); ++e) {
      if (experts[e].tier != ExpertTier::HostCpu) continue;
      mask[e] = 1, any = true;
    }
    if (!any) continue;
    layers[l].resize(experts.size());
    for (size_t e = 0; e < experts.size(); ++e)
      if (mask[e]) layers[l][e] = w.host_cpu[l][e].view();
    SPW_TRY(upload(mask, h->on_cpu_[l]));
  }
  HostMoeWorkerOptions wo;
  wo.n_threads = options.n_threads;
  wo.swiglu_limit = c.swiglu_limit;
  if (options.int16_activations) wo.kernel.activations = Exl3Activations::kInt16;
  h->worker_ = std::make_unique<HostMoeWorker>(h->host_box_, std::move(layers), wo);
  return h;
}

HostExperts::~HostExperts() { worker_.reset(); }  // the thread stops before the mailbox is freed

Status HostExperts::post(int layer, const float* x, const int32_t* experts, const float* weights, int n,
                         int32_t* gpu_experts, cudaStream_t stream) {
  return host_moe_post_cuda(device_box_, layer, x, experts, weights, on_cpu_[layer].get(), n, int(layout_.top_k),
                            gpu_experts, stream);
}

Status HostExperts::collect(float* acc, int n, cudaStream_t stream) {
  return host_moe_collect_cuda(device_box_, acc, n, options_.wait_timeout_ns, stream);
}

Status HostExperts::check() {
  if (host_box_.header->failed == 0) return {};
  host_box_.header->failed = 0;
  return make_error("the CPU expert worker did not answer within ", options_.wait_timeout_ns / 1'000'000'000,
                    " s (served ", worker_->requests_served(), " requests); the step's output is incomplete");
}

}  // namespace spw::engine
