// `spillway kl`: how far quantized packs' next-token distributions are from the source
// model's on the same tokens (mean KL(P‖Q), top-1 agreement, both perplexities), per pack and per
// position. P's forward runs once; every Q sees the same rows.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "model/model.h"
#include "quantize/calibration.h"
#include "quantize/quantize_model.h"

namespace spw::quant {
namespace {

void log_softmax(const float* x, size_t n, std::vector<double>& out) {
  out.resize(n);
  double mx = x[0];
  for (size_t i = 1; i < n; ++i) mx = std::max(mx, double(x[i]));
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += std::exp(double(x[i]) - mx);
  const double lse = mx + std::log(s);
  for (size_t i = 0; i < n; ++i) out[i] = double(x[i]) - lse;
}

// All-position logits of `rows` [first, last) in one forward_batch.
Result<std::vector<std::vector<float>>> batch_logits(const Model& m, const std::vector<std::vector<int32_t>>& rows,
                                                     size_t first, size_t last) {
  std::vector<SequenceState> states;
  for (size_t r = first; r < last; ++r) states.push_back(m.new_sequence());
  std::vector<SequenceState*> seqs;
  std::vector<std::span<const int32_t>> toks;
  for (size_t r = first; r < last; ++r) {
    seqs.push_back(&states[r - first]);
    toks.emplace_back(rows[r]);
  }
  ForwardOptions fo;
  fo.all_logits = true;
  return m.forward_batch(seqs, toks, fo);
}

}  // namespace

Result<std::vector<KlResult>> eval_kl(const std::string& model_p, const std::vector<std::string>& models_q,
                                      const std::string& text_path, int64_t max_tokens, int row_tokens, int batch,
                                      int shard, int n_shards) {
  if (models_q.empty()) return make_error("kl: no model to compare");
  if (n_shards < 1 || shard < 0 || shard >= n_shards) return make_error("kl: shard ", shard, " of ", n_shards);
  // load_calibration_rows speaks of calibration files; kl's file is the held-out text.
  if (!std::filesystem::is_regular_file(text_path))
    return make_error("kl: held-out text ", text_path, " not found (pass --text FILE, .txt or .jsonl)");
  auto all_rows = load_calibration_rows(model_p, text_path, max_tokens, row_tokens);
  if (!all_rows.ok()) return all_rows.error();
  std::vector<std::vector<int32_t>> rs;
  std::vector<int32_t> row_id;
  for (size_t r = size_t(shard); r < all_rows->rows.size(); r += size_t(n_shards)) {
    rs.push_back(all_rows->rows[r]);
    row_id.push_back(int32_t(r));
  }
  auto mp = load_model(model_p, Numerics::reference());
  if (!mp.ok()) return mp.error();
  std::vector<std::unique_ptr<Model>> mq;
  for (const auto& q : models_q) {
    auto m = load_model(q, Numerics::reference());
    if (!m.ok()) return m.error();
    if ((*m)->config().vocab_size != (*mp)->config().vocab_size)
      return make_error("kl: ", q, " has a different vocabulary than ", model_p);
    mq.push_back(std::move(m.value()));
  }
  const size_t vocab = size_t((*mp)->config().vocab_size);
  const size_t nq = mq.size();
  std::vector<KlResult> res(nq);
  std::vector<double> nll_q(nq, 0.0);
  double nll_p = 0;
  int64_t positions = 0;
  std::vector<double> lp, lq;
  std::vector<size_t> argmax_p;
  const size_t step = size_t(std::max(1, batch));
  for (size_t first = 0; first < rs.size(); first += step) {
    const size_t last = std::min(rs.size(), first + step);
    auto yp = batch_logits(**mp, rs, first, last);
    if (!yp.ok()) return yp.error();
    // P's log-probabilities are recomputed per Q (cheap next to the forwards, saves a copy).
    for (size_t qi = 0; qi < nq; ++qi) {
      auto yq = batch_logits(*mq[qi], rs, first, last);
      if (!yq.ok()) return yq.error();
      KlResult& r = res[qi];
      for (size_t b = 0; b < last - first; ++b) {
        const auto& row = rs[first + b];
        double row_kl = 0;
        for (size_t i = 0; i + 1 < row.size(); ++i) {
          log_softmax((*yp)[b].data() + i * vocab, vocab, lp);
          log_softmax((*yq)[b].data() + i * vocab, vocab, lq);
          double k = 0;
          size_t ap = 0, aq = 0;
          for (size_t v = 0; v < vocab; ++v) {
            k += std::exp(lp[v]) * (lp[v] - lq[v]);
            if (lp[v] > lp[ap]) ap = v;
            if (lq[v] > lq[aq]) aq = v;
          }
          row_kl += k;
          r.position_kl.push_back(k);
          r.position_agree.push_back(ap == aq);
          r.position_row.push_back(row_id[first + b]);
          if (qi == 0) {
            nll_p -= lp[size_t(row[i + 1])];
            ++positions;
          }
          nll_q[qi] -= lq[size_t(row[i + 1])];
        }
        if (row.size() > 1) r.row_kl.push_back(row_kl / double(row.size() - 1));
      }
    }
    std::fprintf(stderr, "\rkl: %lld positions", (long long)positions);
  }
  std::fprintf(stderr, "\n");
  if (positions == 0) return make_error("kl: no positions");
  for (size_t qi = 0; qi < nq; ++qi) {
    KlResult& r = res[qi];
    r.positions = positions;
    double kl = 0;
    int64_t agree = 0;
    for (double k : r.position_kl) kl += k;
    for (uint8_t a : r.position_agree) agree += a;
    r.mean_kl = kl / double(positions);
    if (r.row_kl.size() > 1) {
      double m = 0, v = 0;
      for (double x : r.row_kl) m += x;
      m /= double(r.row_kl.size());
      for (double x : r.row_kl) v += (x - m) * (x - m);
      r.mean_kl_stderr = std::sqrt(v / double(r.row_kl.size() - 1) / double(r.row_kl.size()));
    }
    r.top1_agreement = double(agree) / double(positions);
    r.ppl_p = std::exp(nll_p / double(positions));
    r.ppl_q = std::exp(nll_q[qi] / double(positions));
  }
  return res;
}

}  // namespace spw::quant
