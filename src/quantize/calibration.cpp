// Calibration rows and Hessian collection; see calibration.h for the policy.
#include "quantize/calibration.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/thread_pool.h"
#include "chat/chat_encoding.h"
#include "formats/safetensors.h"
#include "model/model.h"
#include "ops/ref/linalg.h"
#include "ops/ref/moe.h"
#include "ops/ref/topk.h"
#include "quantize/exl3_quantize.h"
#include "quantize/safetensors_writer.h"
#include "tokenizer/tokenizer.h"

namespace spw::quant {

Result<CalibrationRows> load_calibration_rows(const std::string& model_dir, const std::string& path,
                                              int64_t max_tokens, int row_tokens) {
  if (!std::filesystem::is_regular_file(path))
    return make_error("calibration file ", path, ": not found (pass --calibration FILE; tools/quantize/make_calibration.py "
                      "builds the default mixture; --identity-hessian quantizes without calibration)");
  if (row_tokens < 2 || max_tokens < row_tokens)
    return make_error("calibration: need --calibration-tokens (", max_tokens, ") >= row length (", row_tokens, ") >= 2");
  auto config = read_model_config(model_dir);
  if (!config.ok()) return config.error();
  auto tok = Tokenizer::load(model_dir + "/tokenizer.json");
  if (!tok.ok()) return tok.error();
  const Tokenizer& tokenizer = **tok;
  const ChatFamily family = config->is_v41() ? ChatFamily::v41 : ChatFamily::v4;
  const int32_t bos = int32_t(config->bos_id);

  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string content = ss.str();
  CalibrationRows out;
  std::vector<int32_t> stream;
  auto add_text = [&](const std::string& text) {
    stream.push_back(bos);
    auto ids = tokenizer.encode(text, false);
    stream.insert(stream.end(), ids.begin(), ids.end());
    ++out.n_documents;
  };
  if (path.size() >= 6 && path.substr(path.size() - 6) == ".jsonl") {
    std::istringstream lines(content);
    std::string line;
    int line_no = 0;
    while (std::getline(lines, line)) {
      ++line_no;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      nlohmann::ordered_json j = nlohmann::ordered_json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_object())
        return make_error(path, ":", line_no, ": not a JSON object");
      if (j.contains("text") && j["text"].is_string()) {
        add_text(j["text"].get<std::string>());
      } else if (j.contains("messages")) {
        auto req = parse_chat_request(j, family);
        if (!req.ok()) return make_error(path, ":", line_no, ": ", req.error().message);
        auto prompt = encode_chat(*req);
        if (!prompt.ok()) return make_error(path, ":", line_no, ": ", prompt.error().message);
        auto ids = tokenizer.encode(*prompt, true);
        stream.insert(stream.end(), ids.begin(), ids.end());
        ++out.n_documents;
        ++out.n_chat;
      } else {
        return make_error(path, ":", line_no, ": expected {\"text\": ...} or {\"messages\": [...]}");
      }
    }
  } else {
    add_text(content);
  }
  out.stream_tokens = int64_t(stream.size());
  if (out.stream_tokens < row_tokens)
    return make_error("calibration file ", path, ": only ", out.stream_tokens, " tokens, fewer than one row of ",
                      row_tokens);
  const int64_t n_rows = std::min<int64_t>(max_tokens / row_tokens, out.stream_tokens / row_tokens);
  const int64_t span = out.stream_tokens - row_tokens;
  for (int64_t r = 0; r < n_rows; ++r) {
    const int64_t at = n_rows > 1 ? (r * span) / (n_rows - 1) : 0;
    out.rows.emplace_back(stream.begin() + at, stream.begin() + at + row_tokens);
  }
  return out;
}

namespace {

// y[m][n_out] = x[m][n_in]·Wᵀ, single-threaded (runs inside the pool's parallel loop).
void matmul_local(const float* x, const std::vector<float>& w, float* y, int m, int n_in, int n_out) {
  for (int t = 0; t < m; ++t)
    for (int o = 0; o < n_out; ++o) {
      const float* wr = &w[size_t(o) * n_in];
      const float* xr = x + size_t(t) * n_in;
      float s = 0;
      for (int i = 0; i < n_in; ++i) s += xr[i] * wr[i];
      y[size_t(t) * n_out + o] = s;
    }
}

// The expert's SwiGLU output h [m][F] as the reference computes it (bf16 linear outputs, bf16 h).
void expert_hidden(const Expert& e, const float* xs, int m, int d, float limit, std::vector<float>& h) {
  const int f = e.w1.n_out;
  std::vector<float> g(size_t(m) * f), u(size_t(m) * f);
  matmul_local(xs, e.w1.w, g.data(), m, d, f);
  matmul_local(xs, e.w3.w, u.data(), m, d, f);
  ref::round_bf16_inplace(g.data(), g.size());
  ref::round_bf16_inplace(u.data(), u.size());
  h.resize(size_t(m) * f);
  for (int t = 0; t < m; ++t) ref::swiglu(&g[size_t(t) * f], &u[size_t(t) * f], &h[size_t(t) * f], f, limit, 1.0f);
  ref::round_bf16_inplace(h.data(), h.size());
}

struct ExpertAcc {
  std::vector<double> h13, h2, prior2;
  double n = 0, prior_n = 0;
};

struct LayerAcc {
  std::vector<double> h;
  double n = 0;
  int prior_seen = 0;
  std::vector<ExpertAcc> experts;
};

}  // namespace

uint64_t hessian_layer_bytes(int d, int d_expert, int n_experts, bool gate_up_shared) {
  const uint64_t dd = uint64_t(d) * uint64_t(d), ff = uint64_t(d_expert) * uint64_t(d_expert), E = uint64_t(n_experts);
  const uint64_t acc = dd + E * ((gate_up_shared ? 0 : dd) + 2 * ff);
  const uint64_t out = E * (dd + ff);
  return 8 * (acc + out);
}

Result<std::vector<LayerHessians>> collect_hessians(const std::string& model_dir, const CalibrationRows& rows,
                                                    const HessianOptions& opt) {
  auto model = load_model(model_dir, Numerics::reference());
  if (!model.ok()) return model.error();
  const ModelConfig& c = (*model)->config();
  const ModelWeights& w = (*model)->weights();  // routing and the expert hidden states, from the forward's own copy
  const int d = c.d_model, f = c.d_expert, E = c.n_experts, K = c.top_k;

  std::vector<int> slot_of(size_t(c.n_layers), -1);
  std::vector<LayerAcc> acc(opt.layers.size());
  for (size_t i = 0; i < opt.layers.size(); ++i) {
    const int l = opt.layers[i];
    if (l < 0 || l >= c.n_layers) return make_error("layer ", l, " outside 0..", c.n_layers - 1);
    slot_of[size_t(l)] = int(i);
    acc[i].h.assign(size_t(d) * d, 0.0);
    acc[i].experts.resize(static_cast<size_t>(E));
    for (auto& e : acc[i].experts) {
      if (!opt.gate_up_shared) e.h13.assign(size_t(d) * d, 0.0);  // shared: every expert takes the layer's H
      e.h2.assign(size_t(f) * f, 0.0);
      e.prior2.assign(size_t(f) * f, 0.0);
    }
  }

  std::span<const int32_t> cur_tokens;
  auto on_ffn_in = [&](int layer, const float* x, int n) {
    LayerAcc& la = acc[size_t(slot_of[size_t(layer)])];
    const LayerWeights& lw = w.layers[size_t(layer)];
    hessian_add_outer(la.h, x, nullptr, n, d);
    la.n += n;
    // Router, as model/moe.cpp: sqrtsoftplus scores, biased top-k (or the hash table), weights.
    std::vector<float> logits(size_t(n) * E), scores(size_t(n) * E), biased(static_cast<size_t>(E));
    ref::matmul_nt(x, lw.gate.w.data(), logits.data(), size_t(n), size_t(d), size_t(E));
    ref::sqrtsoftplus(logits.data(), scores.data(), logits.size());
    std::vector<std::vector<int>> tok_of(static_cast<size_t>(E));
    std::vector<std::vector<float>> wt_of(static_cast<size_t>(E));
    std::vector<int32_t> idx(static_cast<size_t>(K));
    std::vector<float> rw(static_cast<size_t>(K));
    for (int i = 0; i < n; ++i) {
      const float* si = &scores[size_t(i) * E];
      if (c.layers[size_t(layer)].hash_routed) {
        std::memcpy(idx.data(), &lw.tid2eid[size_t(cur_tokens[size_t(i)]) * K], sizeof(int32_t) * K);
      } else {
        for (int e = 0; e < E; ++e) biased[size_t(e)] = si[e] + lw.gate_bias[size_t(e)];
        auto top = ref::topk_indices(biased.data(), size_t(E), size_t(K));
        std::copy(top.begin(), top.end(), idx.begin());
      }
      ref::route_weights(si, idx.data(), size_t(K), c.is_v41() ? 1e-20f : 0.f, c.route_scale, rw.data());
      for (int k = 0; k < K; ++k) {
        tok_of[size_t(idx[size_t(k)])].push_back(i);
        wt_of[size_t(idx[size_t(k)])].push_back(opt.routing_weighted ? rw[size_t(k)] : 1.0f);
      }
    }
    const int n_prior = std::min(n, std::max(0, opt.prior_sample_tokens - la.prior_seen));
    la.prior_seen += n_prior;
    global_pool().parallel_for(size_t(E), [&](size_t e0, size_t e1) {
      std::vector<float> xs, h;
      for (size_t e = e0; e < e1; ++e) {
        ExpertAcc& ea = la.experts[e];
        const int m = int(tok_of[e].size());
        if (m > 0) {
          xs.resize(size_t(m) * d);
          for (int j = 0; j < m; ++j) std::memcpy(&xs[size_t(j) * d], x + size_t(tok_of[e][size_t(j)]) * d, sizeof(float) * d);
          if (!opt.gate_up_shared) hessian_add_outer(ea.h13, xs.data(), wt_of[e].data(), m, d);
          expert_hidden(lw.experts[e], xs.data(), m, d, c.swiglu_limit, h);
          hessian_add_outer(ea.h2, h.data(), wt_of[e].data(), m, f);
          for (float v : wt_of[e]) ea.n += v;
        }
        if (n_prior > 0) {
          expert_hidden(lw.experts[e], x, n_prior, d, c.swiglu_limit, h);
          hessian_add_outer(ea.prior2, h.data(), nullptr, n_prior, f);
          ea.prior_n += n_prior;
        }
      }
    });
  };

  int64_t total = 0, done = 0;
  for (const auto& r : rows.rows) total += int64_t(r.size());
  for (const auto& row : rows.rows) {
    SequenceState seq = (*model)->new_sequence();
    cur_tokens = row;
    ForwardOptions fo;
    fo.on_intermediate = [&](const char* name, int layer, const float* data, size_t count) {
      if (std::strcmp(name, "ffn.in") == 0 && slot_of[size_t(layer)] >= 0) on_ffn_in(layer, data, int(count / size_t(d)));
    };
    auto r = (*model)->forward(seq, row, fo);
    if (!r.ok()) return r.error();
    done += int64_t(row.size());
    if (opt.on_progress) opt.on_progress(done, total);
  }

  std::vector<LayerHessians> out;
  const double n0 = opt.prior_tokens;
  for (size_t i = 0; i < opt.layers.size(); ++i) {
    LayerAcc& la = acc[i];
    LayerHessians lh;
    lh.layer = opt.layers[i];
    lh.d = d;
    lh.f = f;
    lh.layer_tokens = la.n;
    lh.w13.resize(static_cast<size_t>(E));
    lh.w2.resize(static_cast<size_t>(E));
    lh.tokens.resize(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) {
      ExpertAcc& ea = la.experts[size_t(e)];
      lh.tokens[size_t(e)] = ea.n;
      std::vector<double>& h13 = lh.w13[size_t(e)];
      h13.assign(size_t(d) * d, 0.0);
      if (opt.gate_up_shared) {
        for (size_t j = 0; j < h13.size(); ++j) h13[j] = la.n > 0 ? la.h[j] / la.n : 0.0;
      } else if (ea.n + n0 > 0) {
        for (size_t j = 0; j < h13.size(); ++j)
          h13[j] = (ea.h13[j] + (la.n > 0 ? n0 * la.h[j] / la.n : 0.0)) / (ea.n + (la.n > 0 ? n0 : 0.0));
      }
      std::vector<double>& h2 = lh.w2[size_t(e)];
      h2.assign(size_t(f) * f, 0.0);
      const double prior_w = ea.prior_n > 0 ? n0 : 0.0;
      if (ea.n + prior_w > 0)
        for (size_t j = 0; j < h2.size(); ++j)
          h2[j] = (ea.h2[j] + (ea.prior_n > 0 ? prior_w * ea.prior2[j] / ea.prior_n : 0.0)) / (ea.n + prior_w);
    }
    out.push_back(std::move(lh));
    la = LayerAcc{};  // its accumulators are no longer needed: the peak is the accumulators plus one output layer
  }
  return out;
}

Status save_layer_hessians(const std::string& path, const LayerHessians& h) {
  SafetensorsWriter wr;
  const int E = int(h.w13.size());
  for (int e = 0; e < E; ++e) {
    wr.add_raw("w13." + std::to_string(e), DType::F64, {h.d, h.d}, h.w13[size_t(e)].data(), h.w13[size_t(e)].size() * 8);
    wr.add_raw("w2." + std::to_string(e), DType::F64, {h.f, h.f}, h.w2[size_t(e)].data(), h.w2[size_t(e)].size() * 8);
  }
  wr.add_raw("tokens", DType::F64, {E}, h.tokens.data(), h.tokens.size() * 8);
  wr.add_raw("layer_tokens", DType::F64, {1}, &h.layer_tokens, 8);
  return wr.write(path);
}

Result<LayerHessians> load_layer_hessians(const std::string& path, int layer) {
  auto file = SafetensorsFile::open(path);
  if (!file.ok()) return file.error();
  const SafetensorsFile& fl = **file;
  LayerHessians h;
  h.layer = layer;
  auto get = [&](const std::string& name, std::vector<double>& out) -> Status {
    const TensorInfo* t = fl.find(name);
    if (!t || t->dtype != DType::F64) return make_error(path, ": missing F64 tensor ", name);
    out.resize(size_t(t->numel()));
    std::memcpy(out.data(), t->data, t->nbytes);
    return {};
  };
  SPW_TRY(get("tokens", h.tokens));
  std::vector<double> lt;
  SPW_TRY(get("layer_tokens", lt));
  h.layer_tokens = lt.empty() ? 0 : lt[0];
  const int E = int(h.tokens.size());
  h.w13.resize(static_cast<size_t>(E));
  h.w2.resize(static_cast<size_t>(E));
  for (int e = 0; e < E; ++e) {
    SPW_TRY(get("w13." + std::to_string(e), h.w13[size_t(e)]));
    SPW_TRY(get("w2." + std::to_string(e), h.w2[size_t(e)]));
  }
  h.d = int(std::lround(std::sqrt(double(h.w13.empty() ? 0 : h.w13[0].size()))));
  h.f = int(std::lround(std::sqrt(double(h.w2.empty() ? 0 : h.w2[0].size()))));
  return h;
}

}  // namespace spw::quant
