// `spillway eval-kl`: how far a quantized pack's next-token distributions are from the source
// model's on the same tokens (mean KL(P‖Q), top-1 agreement, both perplexities).
#include <cmath>
#include <cstdio>

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

}  // namespace

Result<KlResult> eval_kl(const std::string& model_p, const std::string& model_q, const std::string& text_path,
                         int64_t max_tokens, int row_tokens) {
  auto rows = load_calibration_rows(model_p, text_path, max_tokens, row_tokens);
  if (!rows.ok()) return rows.error();
  auto mp = load_model(model_p, Numerics::reference());
  if (!mp.ok()) return mp.error();
  auto mq = load_model(model_q, Numerics::reference());
  if (!mq.ok()) return mq.error();
  const size_t vocab = size_t((*mp)->config().vocab_size);
  if (size_t((*mq)->config().vocab_size) != vocab) return make_error("eval-kl: the two models have different vocabularies");
  KlResult r;
  double kl = 0, nll_p = 0, nll_q = 0;
  int64_t agree = 0;
  std::vector<double> lp, lq;
  ForwardOptions fo;
  fo.all_logits = true;
  for (const auto& row : rows->rows) {
    const double kl_before = kl;
    const int64_t positions_before = r.positions;
    SequenceState sp = (*mp)->new_sequence(), sq = (*mq)->new_sequence();
    auto yp = (*mp)->forward(sp, row, fo);
    if (!yp.ok()) return yp.error();
    auto yq = (*mq)->forward(sq, row, fo);
    if (!yq.ok()) return yq.error();
    for (size_t i = 0; i + 1 < row.size(); ++i) {
      log_softmax(yp->data() + i * vocab, vocab, lp);
      log_softmax(yq->data() + i * vocab, vocab, lq);
      double k = 0;
      size_t ap = 0, aq = 0;
      for (size_t v = 0; v < vocab; ++v) {
        k += std::exp(lp[v]) * (lp[v] - lq[v]);
        if (lp[v] > lp[ap]) ap = v;
        if (lq[v] > lq[aq]) aq = v;
      }
      kl += k;
      agree += ap == aq;
      nll_p -= lp[size_t(row[i + 1])];
      nll_q -= lq[size_t(row[i + 1])];
      ++r.positions;
    }
    if (r.positions > positions_before) r.row_kl.push_back((kl - kl_before) / double(r.positions - positions_before));
    std::fprintf(stderr, "\reval-kl: %lld positions", (long long)r.positions);
  }
  std::fprintf(stderr, "\n");
  if (r.positions == 0) return make_error("eval-kl: no positions");
  r.mean_kl = kl / double(r.positions);
  if (r.row_kl.size() > 1) {
    double m = 0, v = 0;
    for (double x : r.row_kl) m += x;
    m /= double(r.row_kl.size());
    for (double x : r.row_kl) v += (x - m) * (x - m);
    r.mean_kl_stderr = std::sqrt(v / double(r.row_kl.size() - 1) / double(r.row_kl.size()));
  }
  r.top1_agreement = double(agree) / double(r.positions);
  r.ppl_p = std::exp(nll_p / double(r.positions));
  r.ppl_q = std::exp(nll_q / double(r.positions));
  return r;
}

}  // namespace spw::quant
