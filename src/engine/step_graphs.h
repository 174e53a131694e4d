// CUDA graphs for decode steps: a decode step's kernels are recorded by stream capture and
// replayed from an executable graph kept per (batch size, segment), so the GPU runs them back to back
// instead of one launch at a time.
//
// Why capture every step and update, rather than replay one fixed graph: a step's launches carry values
// the host plans per step (positions, the compressors' entry ids and counts, the arena addresses of the
// step's arrays, V4.1's candidate stride that grows with the context) and some kernels are left out when
// their count is zero. So each step is captured again (recording is cheap: no driver submission) and the
// executable graph of the same shape is updated in place (cudaGraphExecUpdate takes new kernel arguments,
// grid sizes and copy/memset operands); a graph is instantiated only for a shape not seen before (a new
// batch size, or a different set of launched kernels: the "topology signature" below).
//
// Segments: the step is cut into segments (the embedding and each layer, then the head), each captured
// and launched on its own, so the host records segment k + 1 while the GPU runs segment k; one graph for
// the whole step would leave the GPU idle while the host records all of it.
//
// Requirements on the captured code: only stream-ordered work on the model's stream (kernels, memsets,
// device copies, copies from pinned host memory: PinnedStaging), no synchronisation and no host reads of
// device values. GpuModel::decode captures only steps that meet this (≤ 16 rows with the device MoE
// dispatch, no test hooks). Uploads in a captured segment read their pinned staging bytes when the graph
// runs, which is before the step's first synchronisation resets the staging buffer.
// Tests: tests/gpu/test_engine_graphs.cpp (graphs on vs off: identical tokens and logits over many steps
// and batch sizes, with the topology changes of compressor boundaries).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "base/status.h"

namespace spw::engine {

struct StepGraphStats {
  int64_t segments = 0;        // segments launched from a graph
  int64_t updates = 0;         // ... of which through an in-place update of an existing graph
  int64_t instantiations = 0;  // graphs instantiated (first use of a shape, or an update the driver refused)
  double record_us = 0;        // host time recording, updating/instantiating and launching
};

class StepGraphs {
 public:
  StepGraphs() = default;
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;
  ~StepGraphs();

  // Starts recording segment `segment` of a step of `rows` rows on `stream` (ends and launches the
  // segment being recorded first).
  Status begin_segment(cudaStream_t stream, int rows, int segment);
  // Ends the recording, updates or instantiates the segment's executable graph and launches it.
  Status end_segment();
  // Ends a recording without launching it (after an error in the captured code); safe to call always.
  void abort();
  bool recording() const { return recording_; }

  const StepGraphStats& stats() const { return stats_; }
  size_t graph_count() const;

 private:
  struct Exec {
    uint64_t signature = 0;
    cudaGraphExec_t exec = nullptr;
  };
  static constexpr size_t kShapesPerKey = 8;  // topologies kept per (rows, segment); the oldest is dropped

  Status launch(cudaGraph_t graph);

  std::map<std::pair<int, int>, std::vector<Exec>> execs_;
  cudaStream_t stream_ = nullptr;
  int rows_ = 0, segment_ = 0;
  bool recording_ = false;
  StepGraphStats stats_;
};

// A graph's topology signature: the ordered node types and kernel functions (two captures with the same
// signature differ only in parameters, which cudaGraphExecUpdate can change).
Result<uint64_t> graph_signature(cudaGraph_t graph);

}  // namespace spw::engine
