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
#include "quantize/hessian_file.h"
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

// The expert's SwiGLU output h [m][F] as the reference computes it (bf16 linear outputs, bf16 h).
void expert_hidden(const Expert& e, const float* xs, int m, int d, float limit, std::vector<float>& h) {
  const int f = e.w1.n_out;
  std::vector<float> g(size_t(m) * f), u(size_t(m) * f);
  ref::matmul_nt_serial(xs, e.w1.w.data(), g.data(), size_t(m), size_t(d), size_t(f));  // inside the pool's loop
  ref::matmul_nt_serial(xs, e.w3.w.data(), u.data(), size_t(m), size_t(d), size_t(f));
  ref::round_bf16_inplace(g.data(), g.size());
  ref::round_bf16_inplace(u.data(), u.size());
  h.resize(size_t(m) * f);
  for (int t = 0; t < m; ++t) ref::swiglu(&g[size_t(t) * f], &u[size_t(t) * f], &h[size_t(t) * f], f, limit, 1.0f);
  ref::round_bf16_inplace(h.data(), h.size());
}

// Where one expert's calibration tokens are: (row, position) pairs in row-major order, with their weights ω.
struct ExpertTokens {
  std::vector<int> row, pos;
  std::vector<float> weight;
  double n = 0;  // Σ ω
};

// Calibration tokens whose MoE runs together in the streamed forward: large enough that each routed expert, dequantized
// once per batch, sees a few hundred tokens (V4.1: 16,384 × 6 / 384 = 256), small enough for the batch's MoE
// buffers (its inputs and outputs, ≈ 0.7 GB at d = 5120).
constexpr int64_t kBatchTokens = 16384;

// Tokens per accumulation chunk: bounds the per-thread gather buffers (V4.1: 256 × 5120 floats).
constexpr int kChunk = 256;

// x rows of `where` [begin, end) gathered from the per-row inputs.
void gather(const std::vector<std::vector<float>>& inputs, const ExpertTokens& where, size_t begin, size_t end, int d,
            std::vector<float>& xs) {
  xs.resize((end - begin) * size_t(d));
  for (size_t j = begin; j < end; ++j)
    std::memcpy(&xs[(j - begin) * size_t(d)], &inputs[size_t(where.row[j])][size_t(where.pos[j]) * d], sizeof(float) * d);
}

// Routing of every calibration token at one layer, as model/moe.cpp routes it: per expert, its tokens.
std::vector<ExpertTokens> route_tokens(const ModelConfig& c, const LayerWeights& lw, int layer, const CalibrationRows& rows,
                                       const std::vector<std::vector<float>>& inputs, bool routing_weighted) {
  const int d = c.d_model, E = c.n_experts, K = c.top_k;
  std::vector<ExpertTokens> out(static_cast<size_t>(E));
  std::vector<float> biased(static_cast<size_t>(E));
  std::vector<int32_t> idx(static_cast<size_t>(K));
  std::vector<float> rw(static_cast<size_t>(K));
  for (size_t r = 0; r < rows.rows.size(); ++r) {
    const int n = int(rows.rows[r].size());
    const float* x = inputs[r].data();
    // sqrtsoftplus scores, biased top-k (or the hash table), weights from the unbiased scores.
    std::vector<float> logits(size_t(n) * E), scores(size_t(n) * E);
    ref::matmul_nt(x, lw.gate.w.data(), logits.data(), size_t(n), size_t(d), size_t(E));
    ref::sqrtsoftplus(logits.data(), scores.data(), logits.size());
    for (int i = 0; i < n; ++i) {
      const float* si = &scores[size_t(i) * E];
      if (c.layers[size_t(layer)].hash_routed) {
        std::memcpy(idx.data(), &lw.tid2eid[size_t(rows.rows[r][size_t(i)]) * K], sizeof(int32_t) * K);
      } else {
        for (int e = 0; e < E; ++e) biased[size_t(e)] = si[e] + lw.gate_bias[size_t(e)];
        auto top = ref::topk_indices(biased.data(), size_t(E), size_t(K));
        std::copy(top.begin(), top.end(), idx.begin());
      }
      ref::route_weights(si, idx.data(), size_t(K), c.is_v41() ? 1e-20f : 0.f, c.route_scale, rw.data());
      for (int k = 0; k < K; ++k) {
        ExpertTokens& et = out[size_t(idx[size_t(k)])];
        et.row.push_back(int(r));
        et.pos.push_back(i);
        et.weight.push_back(routing_weighted ? rw[size_t(k)] : 1.0f);
        et.n += et.weight.back();
      }
    }
  }
  return out;
}

// One layer's Hessians from its FFN inputs (every row's "ffn.in"), written to `path` group by group.
Status write_layer_hessians(const ModelConfig& c, const ModelWeights& w, int layer, const CalibrationRows& rows,
                            const std::vector<std::vector<float>>& inputs, const HessianOptions& opt,
                            const std::string& path) {
  const LayerWeights& lw = w.layers[size_t(layer)];
  const int d = c.d_model, f = c.d_expert, E = c.n_experts;
  const double n0 = opt.prior_tokens;
  const std::vector<ExpertTokens> routed = route_tokens(c, lw, layer, rows, inputs, opt.routing_weighted);

  // The layer-wide H over every token (rows of H in parallel: each element still sums its tokens in order).
  std::vector<double> h_layer(size_t(d) * d, 0.0);
  double n_layer = 0;
  global_pool().parallel_for(size_t(d), [&](size_t a0, size_t a1) {
    for (size_t r = 0; r < rows.rows.size(); ++r)
      hessian_add_outer_rows(h_layer, inputs[r].data(), nullptr, int(rows.rows[r].size()), d, int(a0), int(a1));
  });
  for (const auto& r : rows.rows) n_layer += double(r.size());

  // The prior's tokens: the first prior_sample_tokens in row order.
  ExpertTokens prior;
  for (size_t r = 0; r < rows.rows.size() && int(prior.row.size()) < opt.prior_sample_tokens; ++r)
    for (int i = 0; i < int(rows.rows[r].size()) && int(prior.row.size()) < opt.prior_sample_tokens; ++i) {
      prior.row.push_back(int(r));
      prior.pos.push_back(i);
    }
  const double prior_n = double(prior.row.size());

  std::vector<double> tokens(static_cast<size_t>(E));
  for (int e = 0; e < E; ++e) tokens[size_t(e)] = routed[size_t(e)].n;
  auto writer = LayerHessianWriter::create(path, d, f, tokens, n_layer, opt.gate_up_shared);
  if (!writer.ok()) return writer.error();

  const int group = opt.expert_group > 0 ? std::min(opt.expert_group, E) : E;
  for (int g0 = 0; g0 < E; g0 += group) {
    const int g1 = std::min(E, g0 + group);
    std::vector<std::vector<double>> h13(size_t(g1 - g0)), h2(size_t(g1 - g0));
    std::vector<Status> status(size_t(g1 - g0));
    global_pool().parallel_for(size_t(g1 - g0), [&](size_t i0, size_t i1) {
      std::vector<float> xs, h;
      for (size_t i = i0; i < i1; ++i) {
        const int e = g0 + int(i);
        const ExpertTokens& et = routed[size_t(e)];
        // The layer is loaded without routed-expert values: each expert is dequantized here, used, freed.
        Expert values;
        if (lw.experts[size_t(e)].w1.empty()) {
          auto r = load_routed_expert(w, c, layer, e);
          if (!r.ok()) {
            status[i] = r.error();
            continue;
          }
          values = std::move(r.value());
        }
        const Expert& ex = lw.experts[size_t(e)].w1.empty() ? values : lw.experts[size_t(e)];
        std::vector<double>& a13 = h13[i];
        std::vector<double>& a2 = h2[i];
        if (!opt.gate_up_shared) a13.assign(size_t(d) * d, 0.0);
        a2.assign(size_t(f) * f, 0.0);
        for (size_t j = 0; j < et.row.size(); j += kChunk) {
          const size_t j1 = std::min(et.row.size(), j + kChunk);
          gather(inputs, et, j, j1, d, xs);
          if (!opt.gate_up_shared) hessian_add_outer(a13, xs.data(), &et.weight[j], int(j1 - j), d);
          expert_hidden(ex, xs.data(), int(j1 - j), d, c.swiglu_limit, h);
          hessian_add_outer(a2, h.data(), &et.weight[j], int(j1 - j), f);
        }
        // Blend with the priors: the layer's H for gate/up, the expert run on the prior tokens for down.
        if (!opt.gate_up_shared) {
          if (et.n + n0 > 0) {
            for (size_t k = 0; k < a13.size(); ++k)
              a13[k] = (a13[k] + (n_layer > 0 ? n0 * h_layer[k] / n_layer : 0.0)) / (et.n + (n_layer > 0 ? n0 : 0.0));
          }
        }
        std::vector<double> prior2(size_t(f) * f, 0.0);
        for (size_t j = 0; j < prior.row.size(); j += kChunk) {
          const size_t j1 = std::min(prior.row.size(), j + kChunk);
          gather(inputs, prior, j, j1, d, xs);
          expert_hidden(ex, xs.data(), int(j1 - j), d, c.swiglu_limit, h);
          hessian_add_outer(prior2, h.data(), nullptr, int(j1 - j), f);
        }
        const double prior_w = prior_n > 0 ? n0 : 0.0;
        if (et.n + prior_w > 0) {
          for (size_t k = 0; k < a2.size(); ++k)
            a2[k] = (a2[k] + (prior_n > 0 ? prior_w * prior2[k] / prior_n : 0.0)) / (et.n + prior_w);
        }
      }
    });
    for (const Status& st : status) SPW_TRY(st);
    for (int e = g0; e < g1; ++e) {
      SPW_TRY((*writer)->add_expert(e, h13[size_t(e - g0)], h2[size_t(e - g0)]));
      h13[size_t(e - g0)] = {};
      h2[size_t(e - g0)] = {};
    }
  }
  if (opt.gate_up_shared)
    for (double& v : h_layer) v = n_layer > 0 ? v / n_layer : 0.0;
  return (*writer)->finish(h_layer);
}

}  // namespace

CalibrationMemory calibration_memory(const ModelConfig& c, const Checkpoint& ck, int64_t calibration_tokens,
                                     int row_tokens, bool gate_up_shared, int threads) {
  CalibrationMemory m;
  std::vector<uint64_t> layer_bytes(size_t(c.n_layers), 0);
  for (const auto& [full_name, t] : ck.tensors()) {
    const std::string name = full_name.rfind("model.", 0) == 0 ? full_name.substr(6) : full_name;
    // Scales are folded into the fp32 values; Engram tables are gathered from the memory map; routed experts are
    // dequantized one at a time (expert_values).
    if (t->dtype == DType::F8_E8M0 || name.find("engram.embed.") != std::string::npos ||
        name.find(".ffn.experts.") != std::string::npos)
      continue;
    const uint64_t bytes = uint64_t(t->numel()) * (t->dtype == DType::I8 ? 2u : 1u) * 4u;  // I8 = two fp4 codes
    if (name.rfind("layers.", 0) == 0) {
      const int layer = std::atoi(name.c_str() + 7);
      if (layer >= 0 && layer < c.n_layers) layer_bytes[size_t(layer)] += bytes;
    } else if (name == "embed.weight" || name == "head.weight" || name == "norm.weight" ||
               name.rfind("hc_head_", 0) == 0 || name == "engram_token_map") {
      m.model_wide += bytes;  // what load_weights keeps besides the layers (not the MTP, vision or aligner weights)
    }
  }
  for (uint64_t b : layer_bytes) m.largest_layer = std::max(m.largest_layer, b);
  const uint64_t d = uint64_t(c.d_model), f = uint64_t(c.d_expert), hc = uint64_t(c.hc_mult);
  m.expert_values = uint64_t(std::max(1, threads)) * 4 * 3 * d * f;
  const uint64_t rows = uint64_t(std::max<int64_t>(1, calibration_tokens / std::max(1, row_tokens)));
  const uint64_t tokens = rows * uint64_t(row_tokens);
  // Streams [n, hc, d] plus a step's x, y; per layer the window ring and the compressed entries and index keys; the
  // MoE batch's accumulators and one expert's gathered inputs and outputs (at most every token of the batch).
  m.row_state = 4 * tokens * (hc + 2) * d + 3 * 4 * uint64_t(std::min<int64_t>(int64_t(tokens), kBatchTokens)) * d;
  for (const LayerPlan& p : c.layers) {
    uint64_t per_row = uint64_t(c.window) * uint64_t(c.d_head);
    if (p.compress_ratio > 0) per_row += uint64_t(row_tokens / p.compress_ratio) * uint64_t(c.d_head + c.index_head_dim);
    m.row_state += 4 * rows * per_row;
  }
  m.layer_inputs = 4 * tokens * d;
  m.layer_hessian = 8 * d * d;
  m.per_expert = 8 * ((gate_up_shared ? 0 : d * d) + 3 * f * f);  // gate/up, down, the down prior
  return m;
}

Status collect_hessians(const std::string& model_dir, const CalibrationRows& rows, const HessianOptions& opt,
                        const std::function<std::string(int)>& hessian_path,
                        const std::function<Status(int)>& on_layer) {
  if (opt.layers.empty()) return {};
  LoadOptions model_wide_only;
  model_wide_only.layer_weights = false;
  auto model_r = load_model(model_dir, Numerics::reference(), model_wide_only);
  if (!model_r.ok()) return model_r.error();
  Model& model = **model_r;
  const ModelConfig& c = model.config();
  for (size_t i = 0; i < opt.layers.size(); ++i)
    if (opt.layers[i] < 0 || opt.layers[i] >= c.n_layers || (i > 0 && opt.layers[i] <= opt.layers[i - 1]))
      return make_error("calibration layers must ascend within 0..", c.n_layers - 1, " (got ", opt.layers[i], ")");

  // Every row's forward, begun; the one layer being collected records its rows' FFN inputs.
  const size_t n_rows = rows.rows.size();
  std::vector<SequenceState> seqs(n_rows, model.new_sequence());
  std::vector<std::vector<float>> inputs(n_rows);
  int collecting = -1;
  std::vector<LayerwiseForward> forwards;
  forwards.reserve(n_rows);
  for (size_t r = 0; r < n_rows; ++r) {
    ForwardOptions fo;
    fo.on_intermediate = [&inputs, &collecting, r](const char* name, int layer, const float* data, size_t count) {
      if (layer == collecting && std::strcmp(name, "ffn.in") == 0) inputs[r].assign(data, data + count);
    };
    auto fwd = model.begin_forward(seqs[r], rows.rows[r], fo);
    if (!fwd.ok()) return fwd.error();
    forwards.push_back(std::move(fwd.value()));
  }

  const int last = opt.layers.back();
  int64_t row_total = 0, done = 0;
  for (const auto& r : rows.rows) row_total += int64_t(r.size());
  const int64_t total = row_total * (last + 1);
  size_t next_collect = 0;
  // Routed experts are dequantized when used (by the batched MoE, then by the Hessians), never a whole layer's at once.
  LoadOptions layer_options;
  layer_options.routed_expert_values = false;
  std::vector<LayerwiseForward*> batch;
  for (auto& fwd : forwards) batch.push_back(&fwd);
  for (int l = 0; l <= last; ++l) {
    SPW_TRY(model.load_layer(l, layer_options));
    const bool collect = opt.layers[next_collect] == l;
    collecting = collect ? l : -1;
    // Rows in batches that together hold about kBatchTokens tokens: each routed expert is dequantized once per batch.
    for (size_t r0 = 0; r0 < n_rows;) {
      size_t r1 = r0;
      int64_t tokens = 0;
      while (r1 < n_rows && (r1 == r0 || tokens + int64_t(rows.rows[r1].size()) <= kBatchTokens))
        tokens += int64_t(rows.rows[r1++].size());
      SPW_TRY(model.run_layer_batch(std::span<LayerwiseForward* const>(batch.data() + r0, r1 - r0)));
      done += tokens;
      if (opt.on_progress) opt.on_progress(done, total);
      r0 = r1;
    }
    if (collect) SPW_TRY(write_layer_hessians(c, model.weights(), l, rows, inputs, opt, hessian_path(l)));
    model.drop_layer(l);
    for (auto& in : inputs) in = {};
    if (collect) {
      ++next_collect;
      SPW_TRY(on_layer(l));
    }
  }
  return {};
}

}  // namespace spw::quant
