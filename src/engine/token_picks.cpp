#include "engine/token_picks.h"

#include <algorithm>

namespace spw::engine {
namespace {

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

// Offsets of the workspace's arrays for rows draws over vocab.
struct Layout {
  size_t mask_row, bits, top_n, first, repeat_end, split, shifts, saved, out, total;
};

Layout layout(int64_t rows, int64_t vocab) {
  const size_t R = size_t(rows), words = size_t(vocab + 63) / 64, S = size_t(kPickShiftsPerStep);
  Layout L{};
  L.mask_row = 0;
  L.bits = L.mask_row + align256(R * sizeof(int64_t));
  L.top_n = L.bits + align256(R * words * sizeof(uint64_t));
  L.first = L.top_n + align256(R * sizeof(int32_t));
  L.repeat_end = L.first + align256((R + 1) * sizeof(int32_t));
  L.split = L.repeat_end + align256(R * sizeof(int32_t));
  L.shifts = L.split + align256(R * sizeof(int32_t));
  L.saved = L.shifts + align256(S * sizeof(cuda::LogitShift));
  L.out = L.saved + align256(S * sizeof(float));
  L.total = L.out + align256(R * sizeof(cuda::RowLogprobs));
  return L;
}

Status copy_up(void* dst, const void* src, size_t nbytes, cudaStream_t stream) {
  if (nbytes == 0) return {};
  if (cudaError_t e = cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, stream); e != cudaSuccess)
    return make_error("pick upload: ", cudaGetErrorString(e));
  return {};
}

}  // namespace

int64_t pick_shifts(const TokenPick& p) {
  return int64_t(p.penalties.size() + p.biases.size() + (p.repetition_penalty != 1.f ? p.repeated.size() : 0));
}

void PickDraws::add(const TokenPick& p) {
  std::vector<cuda::LogitShift>& repeats = shifts_.emplace_back();
  if (p.repetition_penalty != 1.f)
    for (int32_t id : p.repeated) repeats.push_back({id, p.repetition_penalty});
  for (const std::vector<LogitShift>* from : {&p.penalties, &p.biases}) {
    std::vector<cuda::LogitShift>& to = shifts_.emplace_back(from->size());
    for (size_t j = 0; j < from->size(); ++j) to[j] = {(*from)[j].id, (*from)[j].delta};
  }
  const size_t n = shifts_.size();
  TokenDraw d{{p.temperature, p.top_k, p.top_p, p.min_p}, p.u, shifts_[n - 3], shifts_[n - 2], shifts_[n - 1],
              p.allowed, p.top_logprobs};
  draws_.push_back(d);
}

size_t pick_workspace_nbytes(int64_t max_rows, int64_t vocab) { return layout(max_rows, vocab).total; }

bool fits_pick_workspace(std::span<const TokenDraw> draws) {
  int64_t n = 0;
  for (const TokenDraw& d : draws) n += d.shifts();
  return n <= kPickShiftsPerStep;
}

Status PickEdits::before_draw(float* logits, int64_t vocab, std::span<const TokenDraw> draws, cudaStream_t stream) {
  rows_ = int64_t(draws.size());
  vocab_ = vocab;
  const Layout L = layout(rows_, vocab);
  if (L.total > nbytes_) return make_error("pick edits: ", rows_, " rows need ", L.total, " bytes, the workspace has ", nbytes_);
  if (!fits_pick_workspace(draws)) return make_error("pick edits: more than ", kPickShiftsPerStep, " shifts in one call");
  const size_t words = size_t(vocab + 63) / 64;
  const size_t R = static_cast<size_t>(rows_);
  std::vector<int64_t> mask_row(R, -1);
  std::vector<uint64_t> bits;
  std::vector<int32_t> top_n(R), first(R + 1), repeat_end(R), split(R);
  std::vector<cuda::LogitShift> shifts;
  bool masks = false, shifted = false;
  logprobs_ = false;
  for (size_t r = 0; r < draws.size(); ++r) {
    const TokenDraw& d = draws[r];
    if (!d.allowed.empty()) {
      if (d.allowed.size() != words)
        return make_error("pick edits: row ", r, "'s mask has ", d.allowed.size(), " words, the vocabulary needs ", words);
      mask_row[r] = int64_t(bits.size());
      bits.insert(bits.end(), d.allowed.begin(), d.allowed.end());
      masks = true;
    }
    if (d.top_logprobs > cuda::kMaxTopLogprobs)
      return make_error("pick edits: row ", r, " asks for ", d.top_logprobs, " top logprobs, at most ", cuda::kMaxTopLogprobs);
    top_n[r] = std::max(d.top_logprobs, -1);
    logprobs_ = logprobs_ || top_n[r] >= 0;
    first[r] = int32_t(shifts.size());
    shifts.insert(shifts.end(), d.repeats.begin(), d.repeats.end());
    repeat_end[r] = int32_t(shifts.size());
    shifts.insert(shifts.end(), d.penalties.begin(), d.penalties.end());
    split[r] = int32_t(shifts.size());
    shifts.insert(shifts.end(), d.biases.begin(), d.biases.end());
  }
  first[R] = int32_t(shifts.size());
  shifted = !shifts.empty();
  top_n_ = reinterpret_cast<int32_t*>(ws_ + L.top_n);
  first_ = reinterpret_cast<int32_t*>(ws_ + L.first);
  shifts_ = reinterpret_cast<cuda::LogitShift*>(ws_ + L.shifts);
  saved_ = reinterpret_cast<float*>(ws_ + L.saved);
  out_ = reinterpret_cast<cuda::RowLogprobs*>(ws_ + L.out);
  // Pageable copies are staged by the driver before cudaMemcpyAsync returns, so the host vectors may go.
  SPW_TRY(copy_up(ws_ + L.mask_row, mask_row.data(), mask_row.size() * sizeof(int64_t), stream));
  SPW_TRY(copy_up(ws_ + L.bits, bits.data(), bits.size() * sizeof(uint64_t), stream));
  SPW_TRY(copy_up(top_n_, top_n.data(), top_n.size() * sizeof(int32_t), stream));
  SPW_TRY(copy_up(first_, first.data(), first.size() * sizeof(int32_t), stream));
  SPW_TRY(copy_up(ws_ + L.repeat_end, repeat_end.data(), repeat_end.size() * sizeof(int32_t), stream));
  SPW_TRY(copy_up(ws_ + L.split, split.data(), split.size() * sizeof(int32_t), stream));
  SPW_TRY(copy_up(shifts_, shifts.data(), shifts.size() * sizeof(cuda::LogitShift), stream));
  if (masks)
    SPW_TRY(cuda::mask_logits(logits, rows_, vocab, reinterpret_cast<const uint64_t*>(ws_ + L.bits),
                              reinterpret_cast<const int64_t*>(ws_ + L.mask_row), stream));
  if (logprobs_) SPW_TRY(cuda::top_logprobs(logits, rows_, vocab, top_n_, out_, stream));
  if (shifted)
    SPW_TRY(cuda::shift_logits(logits, rows_, vocab, shifts_, first_, reinterpret_cast<const int32_t*>(ws_ + L.repeat_end),
                               reinterpret_cast<const int32_t*>(ws_ + L.split), saved_, stream));
  return {};
}

Status PickEdits::after_draw(const float* logits, const int32_t* next, std::vector<cuda::RowLogprobs>& out,
                             cudaStream_t stream) {
  out.assign(size_t(rows_), cuda::RowLogprobs{});
  if (!logprobs_) return {};
  SPW_TRY(cuda::chosen_logprobs(logits, rows_, vocab_, next, top_n_, shifts_, first_, saved_, out_, stream));
  if (cudaError_t e = cudaMemcpyAsync(out.data(), out_, out.size() * sizeof(cuda::RowLogprobs), cudaMemcpyDeviceToHost,
                                      stream);
      e != cudaSuccess)
    return make_error("pick logprobs download: ", cudaGetErrorString(e));
  if (cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess)
    return make_error("pick logprobs download: ", cudaGetErrorString(e));
  return {};
}

}  // namespace spw::engine
