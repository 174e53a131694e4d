// How Spillway's own kernels are launched: programmatic dependent launch (PDL, sm_90+) on every launch,
// optionally with thread-block clusters.
//
// Why PDL: a decode step is ~50 short kernels per layer, and between two dependent kernels the GPU sat
// idle ~1.4 µs while the next grid was launched (a kernel trace of a decode step showed the GPU busy 86 % of
// the step's wall time). With cudaLaunchAttributeProgrammaticStreamSerialization the next kernel is launched while the
// previous one still runs; its blocks start, do whatever does not read the previous kernel's output
// (a GEMV issues its first weight loads), and wait in pdl_wait() for that kernel to finish.
//
// The contract every kernel launched through launch()/launch_clustered() keeps:
//   - it calls pdl_wait() before it reads anything an earlier kernel of the stream wrote, and before it
//     writes anything at all (an earlier kernel may still read it). One exception, taken knowingly: data
//     written two or more launches back may be read before the wait, through L2 (ld.cg), because the
//     previous kernel had passed its own wait on that writer before this one could start
//     (hc_expand_sinkhorn reads the mixes so, and says so where it is declared);
//   - it calls pdl_launch_dependents() after pdl_wait(), so that at most the next kernel waits on the
//     SMs (a trigger before the wait would let a whole chain of waiting kernels fill the SMs).
// A kernel launched with <<<>>> (or by a library) is an ordinary stream dependency for the next one: the
// attribute only relaxes the edge to a kernel that itself triggered. Captured into a CUDA graph, the
// launches become programmatic edges.
// set_pdl(false) (the CLI calls it for SPILLWAY_PDL=0; the bench's A/B) launches without the attribute;
// pdl_wait() then returns at once, since the previous kernel has finished.
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace spw::cuda {

namespace detail {
// Whether the current device supports programmatic dependent launch (sm_90+).
inline bool device_has_pdl() {
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
    return false;
  return major >= 9;
}
inline bool& pdl_flag() {
  static bool on = device_has_pdl();
  return on;
}
inline cudaLaunchConfig_t config(dim3 grid, dim3 block, size_t smem, cudaStream_t stream) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  return cfg;
}
}  // namespace detail

// Whether launches carry the PDL attribute (sm_90+ and not turned off by set_pdl).
inline bool pdl_enabled() { return detail::pdl_flag(); }
// Turns PDL off or back on for later launches (no effect below sm_90). CUDA graphs recorded since keep
// the edges they were captured with.
inline void set_pdl(bool on) { detail::pdl_flag() = on && detail::device_has_pdl(); }

// kernel<<<grid, block, smem, stream>>>(args...) with PDL; with clusters of `cluster` blocks (cluster
// divides grid) unless cluster is 1×1×1.
template <typename... Params, typename... Args>
cudaError_t launch_clustered(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                             dim3 cluster, Args&&... args) {
  cudaLaunchConfig_t cfg = detail::config(grid, block, smem, stream);
  cudaLaunchAttribute attrs[2]{};
  unsigned n = 0;
  if (cluster.x * cluster.y * cluster.z > 1) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = cluster.x, attrs[n].val.clusterDim.y = cluster.y, attrs[n].val.clusterDim.z = cluster.z;
    ++n;
  }
  if (pdl_enabled()) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = attrs;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

// A cooperative launch (every block resident at once, for cooperative_groups' grid barrier) with PDL.
// Safe with PDL: the blocks that do not fit while the previous kernel runs start as soon as it ends.
template <typename... Params, typename... Args>
cudaError_t launch_cooperative(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                               Args&&... args) {
  cudaLaunchConfig_t cfg = detail::config(grid, block, smem, stream);
  cudaLaunchAttribute attrs[2]{};
  attrs[0].id = cudaLaunchAttributeCooperative;
  attrs[0].val.cooperative = 1;
  attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attrs;
  cfg.numAttrs = pdl_enabled() ? 2 : 1;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

template <typename... Params, typename... Args>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  return launch_clustered(kernel, grid, block, smem, stream, dim3(1, 1, 1), std::forward<Args>(args)...);
}

#ifdef __CUDACC__
// Waits until the kernel this one was launched after has finished and its writes are visible
// (griddepcontrol.wait); returns at once when launched without PDL.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
// Lets the next kernel of the stream launch now (griddepcontrol.launch_dependents); its blocks wait in
// their own pdl_wait() until this kernel has finished.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
// Prefetches [p, p + bytes) into L2, the block's threads taking 128-byte lines in turn: for a kernel's
// weights before pdl_wait(), so that its loads after the wait hit L2 instead of HBM.
__device__ __forceinline__ void prefetch_l2(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (size_t off = size_t(threadIdx.x) * 128; off < bytes; off += size_t(blockDim.x) * 128)
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(c + off));
}
// Both, for kernels with nothing to do before their inputs are ready.
__device__ __forceinline__ void pdl_enter() {
  pdl_wait();
  pdl_launch_dependents();
}
#endif

}  // namespace spw::cuda
