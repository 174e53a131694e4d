// GPU sequences: their slots and the pages of the KV pools they hold (reserved before a step, shared or
// copied by copy_sequence, counted for admission by kv_need / can_hold, returned by free_sequence).
#include <algorithm>

#include "engine/gpu_model.h"
#include "engine/gpu_step.h"

namespace spw::engine {

GpuSequence::GpuSequence(GpuSequence&& o) noexcept { *this = std::move(o); }

GpuSequence& GpuSequence::operator=(GpuSequence&& o) noexcept {
  if (this != &o) {
    if (owner) owner->free_sequence(*this);
    owner = std::exchange(o.owner, nullptr);
    slot = std::exchange(o.slot, -1);
    n_past = o.n_past;
    engram_recent = std::move(o.engram_recent);
    published_index_k_layer = o.published_index_k_layer;
    ring_pages = std::move(o.ring_pages);
    comp_pages = std::move(o.comp_pages);
    key_pages = std::move(o.key_pages);
    keep_rollback = o.keep_rollback;
    rollback = std::move(o.rollback);
  }
  return *this;
}

GpuSequence::~GpuSequence() {
  if (owner) owner->free_sequence(*this);
}

namespace {

// Writes page-table row (layer, slot) of a pool from the sequence's page list (queued on the stream).
Status upload_page_row(GpuState& st, const KvPool& pool, int layer, int slot, const std::vector<int32_t>& pages) {
  int32_t* row = pool.page_table.get() + (size_t(layer) * pool.max_seqs + slot) * pool.max_pages_per_seq;
  return st.staging.upload_bytes(row, pages.data(), pages.size() * sizeof(int32_t), st.stream);
}

// Grows `pages` to n_pages pages of `pool` and publishes the row.
Status grow(GpuState& st, KvPool& pool, int layer, int slot, std::vector<int32_t>& pages, int64_t n_pages) {
  if (int64_t(pages.size()) >= n_pages) return {};
  auto more = pool.alloc.alloc(int32_t(n_pages - int64_t(pages.size())));
  if (!more.ok()) return make_error("KV pool exhausted: ", more.error().message);
  pages.insert(pages.end(), more->begin(), more->end());
  return upload_page_row(st, pool, layer, slot, pages);
}

int64_t pages_for(int64_t rows) { return (rows + cuda::kKvPageRows - 1) / cuda::kKvPageRows; }

}  // namespace

Result<GpuSequence> GpuModel::new_sequence() {
  const ModelConfig& c = config_;
  GpuState& st = *state_;
  auto it = std::find(st.slot_used.begin(), st.slot_used.end(), false);
  if (it == st.slot_used.end())
    return make_error("new_sequence: all ", st.slot_used.size(), " sequence slots of the KV budget are in use");
  GpuSequence seq;
  seq.owner = this;
  seq.slot = int(it - st.slot_used.begin());
  *it = true;
  seq.ring_pages.resize(c.n_layers);
  seq.comp_pages.resize(c.n_layers);
  seq.key_pages.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    SPW_TRY(grow(st, st.ring, l, seq.slot, seq.ring_pages[l], pages_for(c.window)));
    for (CompressorBuffers* cb : {&st.comp_state[l], &st.idx_comp_state[l]})
      if (cb->shape.ratio > 0) SPW_TRY(cuda::compressor_state_reset_cuda(cb->shape, cb->view(), seq.slot, st.stream));
  }
  return seq;
}

namespace {

// Queues copies of the rows of pages src[i] into pages dst[i] of one pool.
Status copy_pages(GpuState& st, const KvPool& pool, const std::vector<int32_t>& src, const std::vector<int32_t>& dst) {
  const size_t nb = cuda::kv_page_nbytes(pool.fmt);
  for (size_t i = 0; i < src.size(); ++i)
    SPW_CUDA_TRY(cudaMemcpyAsync(pool.pages.get() + size_t(dst[i]) * nb, pool.pages.get() + size_t(src[i]) * nb, nb,
                                 cudaMemcpyDeviceToDevice, st.stream));
  return {};
}

// dst := src's first n_shared pages (one more reference each) and copies of the rest, in dst's page-table row.
Status share_pages(GpuState& st, KvPool& pool, int layer, int slot, const std::vector<int32_t>& src, size_t n_shared,
                   std::vector<int32_t>& dst) {
  if (src.empty()) return {};
  n_shared = std::min(n_shared, src.size());
  const std::vector<int32_t> shared(src.begin(), src.begin() + std::ptrdiff_t(n_shared));
  const std::vector<int32_t> rest_src(src.begin() + std::ptrdiff_t(n_shared), src.end());
  auto rest = pool.alloc.alloc(int32_t(rest_src.size()));
  if (!rest.ok()) return make_error("KV pool exhausted: ", rest.error().message);
  pool.alloc.retain(shared);
  dst = shared;
  dst.insert(dst.end(), rest->begin(), rest->end());
  SPW_TRY(copy_pages(st, pool, rest_src, *rest));
  return upload_page_row(st, pool, layer, slot, dst);
}

// Queues a copy of slot `from`'s compressor state into slot `to`.
Status copy_compressor_slot(GpuState& st, const CompressorBuffers& cb, int from, int to) {
  if (cb.shape.ratio == 0) return {};
  const size_t n = size_t(cb.shape.ratio) * cb.shape.width;
  for (const DeviceBuffer<float>* b : {&cb.kv, &cb.score, &cb.prev_kv, &cb.prev_score})
    if (b->get())
      SPW_CUDA_TRY(cudaMemcpyAsync(b->get() + to * n, b->get() + from * n, n * sizeof(float), cudaMemcpyDeviceToDevice,
                                   st.stream));
  return {};
}

}  // namespace

Result<GpuSequence> GpuModel::copy_sequence(const GpuSequence& src) {
  if (src.owner != this || src.slot < 0) return make_error("copy_sequence: a foreign or freed sequence");
  GpuState& st = *state_;
  auto made = new_sequence();
  if (!made.ok()) return made.error();
  GpuSequence& dst = *made;  // returned to the pools by its destructor on any error below
  for (int l = 0; l < config_.n_layers; ++l) {
    SPW_TRY(grow(st, st.ring, l, dst.slot, dst.ring_pages[l], int64_t(src.ring_pages[l].size())));
    SPW_TRY(copy_pages(st, st.ring, src.ring_pages[l], dst.ring_pages[l]));
    const size_t full = size_t(shared_pages(src.n_past, l));
    SPW_TRY(share_pages(st, st.comp, l, dst.slot, src.comp_pages[l], full, dst.comp_pages[l]));
    SPW_TRY(share_pages(st, st.keys, l, dst.slot, src.key_pages[l], full, dst.key_pages[l]));
    SPW_TRY(copy_compressor_slot(st, st.comp_state[l], src.slot, dst.slot));
    SPW_TRY(copy_compressor_slot(st, st.idx_comp_state[l], src.slot, dst.slot));
  }
  dst.n_past = src.n_past;
  dst.engram_recent = src.engram_recent;
  dst.published_index_k_layer = src.published_index_k_layer;
  return made;
}

size_t GpuModel::sequence_nbytes(const GpuSequence& seq) const {
  const GpuState& st = *state_;
  size_t n = 0;
  for (int l = 0; l < config_.n_layers && seq.slot >= 0; ++l) {
    n += seq.ring_pages[l].size() * cuda::kv_page_nbytes(st.ring.fmt) +
         seq.comp_pages[l].size() * cuda::kv_page_nbytes(st.comp.fmt) +
         seq.key_pages[l].size() * cuda::kv_page_nbytes(st.keys.fmt);
    for (const CompressorBuffers* cb : {&st.comp_state[l], &st.idx_comp_state[l]})
      n += size_t(cb->shape.ratio) * cb->shape.width * sizeof(float) * (cb->shape.overlap ? 4 : 2);
  }
  return n;
}

GpuModel::KvPageCounts GpuModel::kv_pages() const {
  KvPageCounts c;
  c.total = plan_.kv.ring_pages + plan_.kv.compressed_pages + plan_.kv.index_key_pages;
  c.used = c.total - (state_->ring.alloc.n_free() + state_->comp.alloc.n_free() + state_->keys.alloc.n_free());
  return c;
}

int64_t GpuModel::shared_pages(int64_t n_past, int layer) const {
  // Pages every row of which holds an entry already written (entries are written once, in order).
  const int r = config_.layers[layer].compress_ratio;
  return options_.share_kv_pages && r > 0 ? n_past / r / cuda::kKvPageRows : 0;
}

GpuModel::KvNeed GpuModel::kv_need(std::span<const Growth> growth) const {
  const ModelConfig& c = config_;
  int64_t slots = 0, ring = 0, comp = 0, keys = 0;
  for (const Growth& g : growth) {
    if (!g.seq) {
      ++slots;
      ring += c.n_layers * pages_for(c.window);
    }
    for (int l = 0; l < c.n_layers; ++l) {
      const int r = c.layers[l].compress_ratio;
      if (r == 0) continue;
      const int64_t want = pages_for(g.n_total / r);
      const int64_t shared = !g.seq && g.copy_of ? shared_pages(g.copy_of->n_past, l) : 0;
      if (layer_has_compressed(c, l))
        comp += std::max<int64_t>(0, want - (g.seq ? int64_t(g.seq->comp_pages[l].size()) : shared));
      if (layer_has_index_keys(c, l))
        keys += std::max<int64_t>(0, want - (g.seq ? int64_t(g.seq->key_pages[l].size()) : shared));
    }
  }
  return {slots, ring, comp, keys};
}

bool GpuModel::can_hold(std::span<const Growth> growth) const {
  const GpuState& st = *state_;
  const KvNeed need = kv_need(growth);
  const int64_t free_slots = std::count(st.slot_used.begin(), st.slot_used.end(), false);
  return need.slots <= free_slots && need.ring <= st.ring.alloc.n_free() && need.comp <= st.comp.alloc.n_free() &&
         need.keys <= st.keys.alloc.n_free();
}

void GpuModel::free_sequence(GpuSequence& seq) {
  if (seq.owner != this || seq.slot < 0) return;
  for (auto& p : seq.ring_pages) state_->ring.alloc.free(p);
  for (auto& p : seq.comp_pages) state_->comp.alloc.free(p);
  for (auto& p : seq.key_pages) state_->keys.alloc.free(p);
  seq.ring_pages.clear();
  seq.comp_pages.clear();
  seq.key_pages.clear();
  state_->slot_used[seq.slot] = false;
  seq.slot = -1;
  seq.owner = nullptr;
}

// Pages for the compressed entries and index keys of every layer after n_total positions.
Status GpuModel::reserve_pages(GpuSequence& seq, int64_t n_total) {
  const ModelConfig& c = config_;
  for (int l = 0; l < c.n_layers; ++l) {
    const int r = c.layers[l].compress_ratio;
    if (r == 0) continue;
    const int64_t pages = pages_for(n_total / r);
    if (layer_has_compressed(c, l)) SPW_TRY(grow(*state_, state_->comp, l, seq.slot, seq.comp_pages[l], pages));
    if (layer_has_index_keys(c, l)) SPW_TRY(grow(*state_, state_->keys, l, seq.slot, seq.key_pages[l], pages));
  }
  return {};
}

}  // namespace spw::engine
