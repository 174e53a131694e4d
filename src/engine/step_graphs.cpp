#include "engine/step_graphs.h"

#include <chrono>

#include "engine/device_buffer.h"

namespace spw::engine {
namespace {

using Clock = std::chrono::steady_clock;

uint64_t mix(uint64_t h, uint64_t v) {  // FNV-1a over 64-bit words
  return (h ^ v) * 0x100000001b3ull;
}

// Destroys a captured graph when it leaves scope.
struct GraphHolder {
  cudaGraph_t g = nullptr;
  ~GraphHolder() {
    if (g) cudaGraphDestroy(g);
  }
};

}  // namespace

Result<uint64_t> graph_signature(cudaGraph_t graph) {
  size_t n = 0;
  SPW_CUDA_TRY(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  SPW_CUDA_TRY(cudaGraphGetNodes(graph, nodes.data(), &n));
  uint64_t h = mix(0xcbf29ce484222325ull, n);
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    SPW_CUDA_TRY(cudaGraphNodeGetType(node, &type));
    h = mix(h, uint64_t(type));
    if (type == cudaGraphNodeTypeKernel) {
      cudaKernelNodeParams p{};
      SPW_CUDA_TRY(cudaGraphKernelNodeGetParams(node, &p));
      h = mix(h, reinterpret_cast<uintptr_t>(p.func));
    }
  }
  return h;
}

StepGraphs::~StepGraphs() {
  abort();
  for (auto& [key, list] : execs_)
    for (Exec& e : list) cudaGraphExecDestroy(e.exec);
}

size_t StepGraphs::graph_count() const {
  size_t n = 0;
  for (const auto& [key, list] : execs_) n += list.size();
  return n;
}

Status StepGraphs::begin_segment(cudaStream_t stream, int rows, int segment) {
  if (recording_) SPW_TRY(end_segment());
  const auto t0 = Clock::now();
  SPW_CUDA_TRY(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  stream_ = stream, rows_ = rows, segment_ = segment, recording_ = true;
  stats_.record_us += std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  return {};
}

void StepGraphs::abort() {
  if (!recording_) return;
  recording_ = false;
  cudaGraph_t g = nullptr;
  cudaStreamEndCapture(stream_, &g);
  if (g) cudaGraphDestroy(g);
  cudaGetLastError();  // the capture's error, if it was invalidated, is reported by the caller's status
}

Status StepGraphs::end_segment() {
  if (!recording_) return {};
  const auto t0 = Clock::now();
  recording_ = false;
  GraphHolder graph;
  if (cudaError_t e = cudaStreamEndCapture(stream_, &graph.g); e != cudaSuccess) {
    cudaGetLastError();  // reported here; left in the runtime's last-error slot, the next launch check would see it
    return make_error("CUDA graph capture of decode segment ", segment_, " failed: ", cudaGetErrorString(e),
                      " (a non-capturable call in the step; run with CUDA graphs off to get the step's own error)");
  }
  SPW_TRY(launch(graph.g));
  stats_.record_us += std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  return {};
}

Status StepGraphs::launch(cudaGraph_t graph) {
  auto sig = graph_signature(graph);
  if (!sig.ok()) return sig.error();
  std::vector<Exec>& list = execs_[{rows_, segment_}];
  Exec* slot = nullptr;
  for (Exec& e : list)
    if (e.signature == *sig) slot = &e;
  if (slot) {
    cudaGraphExecUpdateResultInfo info{};
    if (cudaGraphExecUpdate(slot->exec, graph, &info) == cudaSuccess) {
      ++stats_.updates;
    } else {  // a change the driver does not update in place: drop it and instantiate again below
      cudaGetLastError();
      cudaGraphExecDestroy(slot->exec);
      list.erase(list.begin() + (slot - list.data()));
      slot = nullptr;
    }
  }
  if (!slot) {
    if (list.size() == kShapesPerKey) {
      cudaGraphExecDestroy(list.front().exec);
      list.erase(list.begin());
    }
    Exec e{*sig, nullptr};
    SPW_CUDA_TRY(cudaGraphInstantiate(&e.exec, graph, 0));
    list.push_back(e);
    slot = &list.back();
    ++stats_.instantiations;
  }
  SPW_CUDA_TRY(cudaGraphLaunch(slot->exec, stream_));
  ++stats_.segments;
  return {};
}

}  // namespace spw::engine
