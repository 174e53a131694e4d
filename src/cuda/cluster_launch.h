// Launching a kernel whose blocks form thread-block clusters (sm_90+), with the cluster shape chosen at
// run time: cudaLaunchKernelEx with cudaLaunchAttributeClusterDimension. The kernels that use it (the
// split GEMV, the split attention, argmax) pick their cluster size per call, which __cluster_dims__
// (fixed at compile time) cannot. Capturable into CUDA graphs like a plain launch.
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace spw::cuda {

// kernel<<<grid, block, smem, stream>>>(args...) with clusters of `cluster` blocks (cluster divides grid).
template <typename... Params, typename... Args>
cudaError_t launch_clustered(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                             dim3 cluster, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = cluster.x, attr.val.clusterDim.y = cluster.y, attr.val.clusterDim.z = cluster.z;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace spw::cuda
