#include "engine/host_expert_kernels.h"

#include <cuda/atomic>

namespace spw::engine {
namespace {

constexpr int kThreads = 256;

using SysRef = cuda::atomic_ref<uint32_t, cuda::thread_scope_system>;

__global__ void post_rows_kernel(HostMoeMailbox box, const float* x, const int32_t* experts, const float* weights,
                                 const uint8_t* on_cpu, int top_k, int32_t* gpu_experts) {
  const int64_t t = blockIdx.x, d = box.layout.d;
  const float4* src = reinterpret_cast<const float4*>(x + t * d);
  float4* dst = reinterpret_cast<float4*>(box.x + t * d);
  for (int64_t i = threadIdx.x; i < d / 4; i += blockDim.x) dst[i] = src[i];
  if (int(threadIdx.x) < top_k) {
    const int64_t p = t * top_k + threadIdx.x;
    const int32_t e = experts[p];
    const bool cpu = e >= 0 && on_cpu[e];
    box.ids[p] = cpu ? e : -1;
    box.weights[p] = weights[p];
    gpu_experts[p] = cpu ? -1 : e;
  }
  __threadfence_system();  // the rows reach host memory before the request is published
}

__global__ void publish_kernel(HostMoeMailbox box, int layer, int n) {
  box.header->layer = layer;
  box.header->n_tokens = n;
  __threadfence_system();
  SysRef seq(box.header->request_seq);
  seq.store(seq.load(cuda::memory_order_relaxed) + 1, cuda::memory_order_release);
}

__global__ void collect_kernel(HostMoeMailbox box, float* acc, uint64_t timeout_ns) {
  __shared__ bool answered;
  if (threadIdx.x == 0) {
    const uint32_t want = SysRef(box.header->request_seq).load(cuda::memory_order_relaxed);
    SysRef done(box.header->done_seq);
    uint64_t t0, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    bool ok = true;
    while (done.load(cuda::memory_order_acquire) != want) {
      __nanosleep(200);
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
      if (now - t0 > timeout_ns) {
        ok = false;
        SysRef(box.header->failed).store(1, cuda::memory_order_relaxed);
        break;
      }
    }
    answered = ok;
  }
  __syncthreads();
  if (!answered) return;
  const int64_t t = blockIdx.x, d = box.layout.d;
  const float4* y = reinterpret_cast<const float4*>(box.y + t * d);
  float4* a = reinterpret_cast<float4*>(acc + t * d);
  for (int64_t i = threadIdx.x; i < d / 4; i += blockDim.x) {
    const float4 v = y[i];
    float4 s = a[i];
    s.x = __fadd_rn(s.x, v.x), s.y = __fadd_rn(s.y, v.y), s.z = __fadd_rn(s.z, v.z), s.w = __fadd_rn(s.w, v.w);
    a[i] = s;
  }
}

Status launched(const char* who) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return make_error(who, ": ", cudaGetErrorString(e));
  return {};
}

}  // namespace

Status host_moe_post_cuda(const HostMoeMailbox& box, int layer, const float* x, const int32_t* experts,
                          const float* weights, const uint8_t* on_cpu, int n, int top_k, int32_t* gpu_experts,
                          cudaStream_t stream) {
  if (n < 0 || n > box.layout.max_tokens)
    return make_error("host_moe_post_cuda: ", n, " tokens, the mailbox holds ", box.layout.max_tokens);
  if (top_k > kThreads || top_k != box.layout.top_k || box.layout.d % 4 != 0)
    return make_error("host_moe_post_cuda: top_k ", top_k, " or d ", box.layout.d, " does not match the mailbox");
  if (n == 0) return {};
  post_rows_kernel<<<unsigned(n), kThreads, 0, stream>>>(box, x, experts, weights, on_cpu, top_k, gpu_experts);
  publish_kernel<<<1, 1, 0, stream>>>(box, layer, n);
  return launched("host_moe_post_cuda");
}

Status host_moe_collect_cuda(const HostMoeMailbox& box, float* acc, int n, uint64_t timeout_ns, cudaStream_t stream) {
  if (n <= 0) return {};
  collect_kernel<<<unsigned(n), kThreads, 0, stream>>>(box, acc, timeout_ns);
  return launched("host_moe_collect_cuda");
}

}  // namespace spw::engine
