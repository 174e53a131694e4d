// Taking back the tail of a forward on the GPU (GpuModel::truncate), what speculative decoding needs
// after some verified drafts were rejected. The same plan as the CPU reference (src/model/rollback.cpp):
// a forward of n tokens from position p that keeps a log saves, before it writes them, the window-ring
// rows it replaces and, per compressor, the state rows its positions touch (and the previous group, with
// overlap) plus the rows it pushes; truncate(m) puts back the ring rows of positions ≥ m, restores the
// touched state and pushes the rows of positions p..m−1 again (compressor_push_cuda is deterministic,
// so the state is exactly what those pushes left the first time). Compressed entries and index keys need
// nothing: their count follows from the position, and the rows past it are rewritten when regrown.
// Every copy is queued on the model's stream; the log lives in the slot's rollback area until the
// sequence's next forward.
#include <algorithm>
#include <cstring>

#include "engine/gpu_step.h"

namespace spw::engine {
namespace {

// Queues a device-to-device copy of n floats.
Status copy_floats(GpuState& st, float* dst, const float* src, size_t n) {
  if (n == 0) return {};
  SPW_CUDA_TRY(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, st.stream));
  return {};
}

float* slot_area(GpuState& st, int slot) { return st.rollback_area.get() + size_t(slot) * st.rollback.slot_floats; }

// Copies ring rows between a sequence's ring of `layer` (logical rows (p + i) mod W for i in [i0, i1)) and
// `saved` (row i at byte i·row_nbytes), in runs of consecutive rows within a page.
Status copy_ring_rows(GpuState& st, const GpuSequence& seq, int layer, int W, int64_t p, int i0, int i1,
                      uint8_t* saved, bool to_ring) {
  const size_t row = cuda::kv_row_nbytes(st.ring.fmt);
  const std::vector<int32_t>& pages = seq.ring_pages[size_t(layer)];
  for (int i = i0; i < i1;) {
    const int64_t r = (p + i) % W;
    const int64_t in_page = r % cuda::kKvPageRows;
    // The run ends at the page's end, the ring's end or i1.
    const int run = int(std::min<int64_t>({int64_t(i1 - i), cuda::kKvPageRows - in_page, W - r}));
    uint8_t* ring = st.ring.pages.get() + (size_t(pages[size_t(r / cuda::kKvPageRows)]) * cuda::kKvPageRows +
                                           size_t(in_page)) * row;
    uint8_t* mine = saved + size_t(i) * row;
    SPW_CUDA_TRY(cudaMemcpyAsync(to_ring ? ring : mine, to_ring ? mine : ring, size_t(run) * row,
                                 cudaMemcpyDeviceToDevice, st.stream));
    i += run;
  }
  return {};
}

// Copies the state rows a chunk of n tokens from position p touches (slots p mod r onward, min(n, r) of
// them, wrapping) between the slot's compressor state and `saved` ([touched, width] kv, then score at
// saved + max_touched·width), and with overlap the previous group (after the two).
Status copy_touched_state(GpuState& st, const CompressorBuffers& cb, int slot, int64_t p, int n, float* saved,
                          int max_touched, bool to_state) {
  const int r = cb.shape.ratio, w = cb.shape.width;
  const int touched = std::min(n, r), s0 = int(p % r);
  const size_t state0 = size_t(slot) * r * w;
  for (int k = 0; k < 2; ++k) {
    float* state = (k == 0 ? cb.kv.get() : cb.score.get()) + state0;
    float* mine = saved + size_t(k) * max_touched * w;
    const int first = std::min(touched, r - s0);  // slots s0 .. s0 + first − 1, then 0 .. touched − first − 1
    float* dst1 = to_state ? state + size_t(s0) * w : mine;
    const float* src1 = to_state ? mine : state + size_t(s0) * w;
    SPW_TRY(copy_floats(st, dst1, src1, size_t(first) * w));
    float* dst2 = to_state ? state : mine + size_t(first) * w;
    const float* src2 = to_state ? mine + size_t(first) * w : state;
    SPW_TRY(copy_floats(st, dst2, src2, size_t(touched - first) * w));
  }
  if (cb.shape.overlap)
    for (int k = 0; k < 2; ++k) {
      float* prev = (k == 0 ? cb.prev_kv.get() : cb.prev_score.get()) + state0;
      float* mine = saved + size_t(2 * max_touched + k * r) * w;
      SPW_TRY(copy_floats(st, to_state ? prev : mine, to_state ? mine : prev, size_t(r) * w));
    }
  return {};
}

}  // namespace

void rollback_begin(GpuSequence& seq, std::span<const int32_t> tokens) {
  if (seq.keep_rollback)
    seq.rollback.begin(seq.n_past, tokens, seq.engram_recent, seq.published_index_k_layer);
  else
    seq.rollback.valid = false;
}

Status rollback_save_ring(GpuStep& s, int layer) {
  GpuState& st = s.st;
  for (const StepChunk& ch : s.chunks) {
    if (!ch.seq->keep_rollback) continue;
    auto* saved = reinterpret_cast<uint8_t*>(slot_area(st, ch.seq->slot) + st.rollback.layers[size_t(layer)].ring);
    SPW_TRY(copy_ring_rows(st, *ch.seq, layer, s.c.window, ch.p, 0, ch.n, saved, /*to_ring=*/false));
  }
  return {};
}

Status rollback_save_compressor(GpuStep& s, int layer, const CompressorBuffers& cb, const float* kv,
                                const float* score) {
  GpuState& st = s.st;
  const bool idx = &cb == &st.idx_comp_state[size_t(layer)];
  const RollbackLayout& lay = st.rollback;
  for (const StepChunk& ch : s.chunks) {
    if (!ch.seq->keep_rollback) continue;
    const RollbackLayout::Compressor& where = idx ? lay.layers[size_t(layer)].idx_comp : lay.layers[size_t(layer)].comp;
    float* area = slot_area(st, ch.seq->slot);
    const int w = cb.shape.width, max_touched = std::min(lay.max_tokens, cb.shape.ratio);
    SPW_TRY(copy_touched_state(st, cb, ch.seq->slot, ch.p, ch.n, area + where.before, max_touched, /*to_state=*/false));
    float* pushed = area + where.pushed;
    SPW_TRY(copy_floats(st, pushed, kv + size_t(ch.row0) * w, size_t(ch.n) * w));
    SPW_TRY(copy_floats(st, pushed + size_t(lay.max_tokens) * w, score + size_t(ch.row0) * w, size_t(ch.n) * w));
  }
  return {};
}

Status GpuModel::truncate(GpuSequence& seq, int64_t n_past) {
  if (seq.owner != this || seq.slot < 0) return make_error("truncate: a foreign or freed sequence");
  const HostRollback& log = seq.rollback;
  SPW_TRY(log.check(n_past, seq.n_past));
  const ModelConfig& c = config_;
  GpuState& st = *state_;
  const int64_t p = log.n_before, m = n_past;
  const int n = int(log.tokens.size()), kept = int(m - p);
  float* area = slot_area(st, seq.slot);
  ArenaScope scope(st.arena);  // uploads go out one by one: the replays read them as they are queued
  for (int l = 0; l < c.n_layers; ++l) {
    const RollbackLayout::Layer& where = st.rollback.layers[size_t(l)];
    SPW_TRY(copy_ring_rows(st, seq, l, c.window, p, kept, n, reinterpret_cast<uint8_t*>(area + where.ring),
                           /*to_ring=*/true));
    for (const bool idx : {false, true}) {
      const CompressorBuffers& cb = idx ? st.idx_comp_state[size_t(l)] : st.comp_state[size_t(l)];
      if (cb.shape.ratio == 0) continue;
      const RollbackLayout::Compressor& cw = idx ? where.idx_comp : where.comp;
      const int w = cb.shape.width, max_touched = std::min(st.rollback.max_tokens, cb.shape.ratio);
      SPW_TRY(copy_touched_state(st, cb, seq.slot, p, n, area + cw.before, max_touched, /*to_state=*/true));
      if (kept == 0) continue;
      // Push the kept rows again; the entries they complete are already in the pools.
      const std::vector<int32_t> slot{seq.slot}, n_tokens{kept}, zero{0};
      const std::vector<int64_t> pos0{p};
      DeviceSpan<int32_t> slot_d, n_d, in_row0_d, out_row0_d;
      DeviceSpan<int64_t> pos0_d;
      DeviceSpan<float> entries;
      for (auto [host, dev] : {std::pair{&slot, &slot_d}, std::pair{&n_tokens, &n_d}, std::pair{&zero, &in_row0_d},
                               std::pair{&zero, &out_row0_d}}) {
        SPW_TRY(st.arena.alloc(*dev, 1));
        SPW_TRY(st.staging.upload_bytes(dev->get(), host->data(), sizeof(int32_t), st.stream));
      }
      SPW_TRY(st.arena.alloc(pos0_d, 1));
      SPW_TRY(st.staging.upload_bytes(pos0_d.get(), pos0.data(), sizeof(int64_t), st.stream));
      const int max_entries = kept / cb.shape.ratio + 1;
      SPW_TRY(st.arena.alloc(entries, size_t(max_entries) * cb.shape.d_out()));
      const float* pushed = area + cw.pushed;
      const float* ape = idx ? st.w->layers[size_t(l)].idx_comp_ape : (c.is_v41() ? nullptr : st.w->layers[size_t(l)].comp_ape);
      const cuda::CompressorChunks chunks{slot_d.get(), pos0_d.get(), n_d.get(), in_row0_d.get(), out_row0_d.get()};
      SPW_TRY(cuda::compressor_push_cuda(cb.shape, cb.view(), pushed, pushed + size_t(st.rollback.max_tokens) * w, ape,
                                         chunks, 1, max_entries, entries.get(), st.stream));
    }
  }
  log.restore(c, host_weights_->engram_token_map, numerics_.stale_index_k, m, seq.engram_recent,
              seq.published_index_k_layer);
  seq.n_past = m;
  return {};
}

}  // namespace spw::engine
