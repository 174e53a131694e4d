"""Generate the tiny DeepSeek-V4.1 golden fixtures (model in release format + golden cases).

    .venv-golden/bin/python tools/golden/gen_v41.py --out tests/golden/fixtures/v41 [--seed 41]

Writes <out>/model/{config.json, model.safetensors ("model." prefixed names), engram_token_map.safetensors}
and <out>/cases/p{T}.safetensors, computed with tools/golden/oracle_v41.py (our own transcription of the
DeepSeek reference; PyPI Transformers has no deepseek_v41).  Deterministic given --seed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import release_format as rf  # noqa: E402
from oracle_v41 import OracleV41, Weights, engram_layout  # noqa: E402

PROMPT_LENS = (1, 17, 130, 301)
N_DECODE = 32
HIDDEN_FULL_MAX = 32  # prompts up to this length store hidden.{L} for every row ...
HIDDEN_TAIL = 16  # ... longer ones only for their last 16 rows (metadata hidden_first_row), to bound the size


def make_config(compressed_vocab: int) -> dict:
    tc = dict(
        model_type="deepseek_v41_text", vocab_size=1024, hidden_size=256, moe_intermediate_size=64,
        num_hidden_layers=10, num_attention_heads=4, num_key_value_heads=1, head_dim=128, qk_rope_head_dim=64,
        q_lora_rank=128, o_lora_rank=128, o_groups=2, hidden_act="silu", swiglu_limit=10.0, rms_norm_eps=1e-20,
        attention_bias=False, tie_word_embeddings=False, max_position_embeddings=1048576, rope_theta=10000,
        rope_scaling=dict(rope_type="yarn", factor=16, beta_fast=32, beta_slow=1,
                          original_max_position_embeddings=65536),
        n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, scoring_func="sqrtsoftplus",
        topk_method="noaux_tc", norm_topk_prob=True, routed_scaling_factor=1.5, sliding_window=128,
        compress_ratios=[0, 0, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0], compress_rope_theta=160000,
        kv_source_layer_ids=[2, 4, 6], index_source_layer_ids=[2, 4, 6, 8], index_n_heads=4, index_head_dim=128,
        index_topk=16, candidate_source_layer_id=6, candidate_topk_blocks=4, candidate_block_size=8,
        hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6,
        engram_layer_ids=[1, 4], engram_num_embeddings=None, engram_max_ngram_size=4, engram_vocab_size=1000,
        engram_n_heads=2, engram_head_dim=64, engram_pad_token_id=2, engram_compressed_vocab_size=compressed_vocab,
        num_nextn_predict_layers=3, dspark_block_size=5, dspark_noise_token_id=1000, dspark_target_layer_ids=[7, 8, 9],
        dspark_markov_rank=64, dspark_n_routed_experts=8, dspark_num_experts_per_tok=2,
    )
    tc["engram_num_embeddings"] = engram_layout(tc)[2]
    return dict(
        architectures=["DeepseekV41ForCausalLM"], model_type="deepseek_v41", dtype="bfloat16",
        bos_token_id=0, eos_token_id=1, pad_token_id=2, image_token_id=1023,
        quantization_config=dict(quant_method="fp8", activation_scheme="dynamic", weight_block_size=[32, 32],
                                 scale_fmt="ue8m0", expert_dtype="fp4"),
        text_config=tc,
    )


def make_token_map(rng, vocab: int, n_raw: int = 640):
    raw = rng.integers(0, n_raw, size=vocab)
    remap, out = {}, np.zeros(vocab, dtype=np.int32)
    for t in range(vocab):  # class ids in first-appearance order of token id
        out[t] = remap.setdefault(int(raw[t]), len(remap))
    return out, len(remap)


def make_weights(rng, cfg: dict) -> dict:
    tc = cfg["text_config"]
    d, H, D, ql, G, olr = (tc[k] for k in ("hidden_size", "num_attention_heads", "head_dim", "q_lora_rank",
                                             "o_groups", "o_lora_rank"))
    V, E, I, hc = tc["vocab_size"], tc["n_routed_experts"], tc["moe_intermediate_size"], tc["hc_mult"]
    hi, hd = tc["index_n_heads"], tc["index_head_dim"]
    T = {}

    def g(*shape, std=1.0):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def fp8(name, w):
        q, s, _ = rf.quantize_fp8_block(w, 32)
        T[name + ".weight"] = rf.STensor("F8_E4M3", q)
        T[name + ".scale"] = rf.STensor("F8_E8M0", s)

    def fp4(name, w):
        p, s, _ = rf.quantize_mxfp4(w, 32)
        T[name + ".weight"] = rf.STensor("I8", p)
        T[name + ".scale"] = rf.STensor("F8_E8M0", s)

    def bf(name, w):
        T[name] = rf.st_bf16(w)

    def f32(name, w):
        T[name] = rf.st_f32(w)

    def normw(n):
        return 1.0 + g(n, std=0.2)

    bf("embed.weight", g(V, d))
    bf("head.weight", g(V, d, std=6.0 / np.sqrt(d)))
    bf("norm.weight", normw(d))
    for L in range(tc["num_hidden_layers"]):
        p = f"layers.{L}."
        r = tc["compress_ratios"][L]
        bf(p + "attn_norm.weight", normw(d))
        bf(p + "ffn_norm.weight", normw(d))
        fp8(p + "attn.wq_a", g(ql, d, std=1 / np.sqrt(d)))
        bf(p + "attn.q_norm.weight", normw(ql))
        fp8(p + "attn.wq_b", g(H * D, ql, std=1.5 / np.sqrt(ql)))
        fp8(p + "attn.wkv", g(D, d, std=1 / np.sqrt(d)))
        bf(p + "attn.kv_norm.weight", normw(D))
        fp8(p + "attn.wo_a", g(G * olr, H * D // G, std=1 / np.sqrt(H * D // G)))
        fp8(p + "attn.wo_b", g(d, G * olr, std=1 / np.sqrt(G * olr)))
        f32(p + "attn.attn_sink", g(H))
        for s in ("attn", "ffn"):
            f32(p + f"hc_{s}_fn", g((2 + hc) * hc, hc * d, std=1 / np.sqrt(hc * d)))
            f32(p + f"hc_{s}_base", g((2 + hc) * hc, std=0.7))
            f32(p + f"hc_{s}_scale", rng.uniform(0.3, 1.5, size=3).astype(np.float32))
        bf(p + "ffn.gate.weight", g(E, d, std=2 / np.sqrt(d)))
        f32(p + "ffn.gate.bias", g(E, std=0.3))
        f32(p + "ffn.gate.bias_vl", g(E, std=0.3))
        for e in range(E):
            fp4(p + f"ffn.experts.{e}.w1", g(I, d, std=2.5 / np.sqrt(d)))
            fp4(p + f"ffn.experts.{e}.w3", g(I, d, std=2.5 / np.sqrt(d)))
            fp4(p + f"ffn.experts.{e}.w2", g(d, I, std=1 / np.sqrt(I)))
        fp8(p + "ffn.shared_experts.w1", g(I, d, std=2.5 / np.sqrt(d)))
        fp8(p + "ffn.shared_experts.w3", g(I, d, std=2.5 / np.sqrt(d)))
        fp8(p + "ffn.shared_experts.w2", g(d, I, std=1 / np.sqrt(I)))
        if L in tc["kv_source_layer_ids"]:
            bf(p + "attn.compressor.wkv.weight", g(D, d, std=1 / np.sqrt(d)))
            if r > 1:
                bf(p + "attn.compressor.wgate.weight", g(D, d, std=2 / np.sqrt(d)))
            bf(p + "attn.compressor.norm.weight", normw(D))
            bf(p + "attn.indexer.wk.weight", g(hd, D, std=1 / np.sqrt(D)))
            bf(p + "attn.indexer.k_norm.weight", normw(hd))
        if L in tc["index_source_layer_ids"]:
            fp8(p + "attn.indexer.wq_b", g(hi * hd, ql, std=1 / np.sqrt(ql)))
            bf(p + "attn.indexer.weights_proj.weight", g(hi, d, std=1 / np.sqrt(d)))
        if L in tc["engram_layer_ids"]:
            rows = tc["engram_num_embeddings"][tc["engram_layer_ids"].index(L)]
            hdim = tc["engram_head_dim"]
            tab = g(rows, hdim).reshape(rows, hdim // 32, 32)
            amax = np.maximum(np.abs(tab).max(-1), np.float32(1e-4)).astype(np.float32)
            ex = rf.pow2_ceil_exponent(amax * np.float32(1.0 / 448.0))
            q = rf.e4m3_encode(tab / np.ldexp(np.float32(1.0), ex)[..., None].astype(np.float32))
            T[p + "engram.embed.weight"] = rf.STensor("F8_E4M3", q.reshape(rows, hdim))
            T[p + "engram.embed.scale"] = rf.STensor("F8_E8M0", rf.e8m0_encode_exponent(ex))
            ncols = (tc["engram_max_ngram_size"] - 1) * tc["engram_n_heads"] * hdim
            fp8(p + "engram.wkv", g(d * (hc + 1), ncols, std=1 / np.sqrt(ncols)))
            bf(p + "engram.q_weight", 1.0 + g(hc, d, std=0.3))
            bf(p + "engram.k_weight", 1.0 + g(hc, d, std=0.3))
    return T


def run_case(W, mode, prompt, stale=True):
    o = OracleV41(W, mode=mode, stale_index_k=stale)
    logits, hidden = o.forward(prompt, return_hidden=True)
    ids, dl = [int(logits[-1].argmax())], []
    for _ in range(N_DECODE):
        lg = o.forward([ids[-1]])[0]
        dl.append(lg)
        ids.append(int(lg.argmax()))
    return logits, hidden, torch.tensor(ids[:N_DECODE]), torch.stack(dl), o.stats


def margin(lg):
    top2 = lg.topk(2, dim=-1).values
    return float((top2[..., 0] - top2[..., 1]).min())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/golden/fixtures/v41")
    ap.add_argument("--seed", type=int, default=41)
    a = ap.parse_args()
    torch.set_num_threads(2)
    rng = np.random.default_rng(a.seed)
    tmap, ncls = make_token_map(rng, 1024)
    cfg = make_config(ncls)
    mdir = os.path.join(a.out, "model")
    os.makedirs(mdir, exist_ok=True)
    with open(os.path.join(mdir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    rf.write_safetensors(os.path.join(mdir, "engram_token_map.safetensors"),
                         {"engram_token_map": rf.STensor("I32", tmap)}, {"format": "pt"})
    rf.write_checkpoint(mdir, make_weights(rng, cfg), n_shards=1, prefix="model.")
    W = Weights(mdir)
    V = cfg["text_config"]["vocab_size"]

    # chunked prefill == one-shot prefill (exact mode, stale_index_k=False; the quirk only concerns decode)
    prompt = torch.from_numpy(rng.integers(3, V, size=301)).long()
    one = OracleV41(W, "exact", stale_index_k=False).forward(prompt)
    o = OracleV41(W, "exact", stale_index_k=False)
    chunked = torch.cat([o.forward(prompt[:7]), o.forward(prompt[7:64]), o.forward(prompt[64:])])
    diff = float((one - chunked).abs().max())
    print(f"chunked-vs-oneshot prefill max|dlogit| = {diff:.3e} (logit std {float(one.std()):.2f})")
    assert diff < 1e-3 and torch.equal(one.argmax(-1), chunked.argmax(-1)), diff
    # token-by-token prefill (all decode steps) == one-shot on the first 40 tokens, same mode
    o = OracleV41(W, "exact", stale_index_k=False)
    steps = torch.cat([o.forward(prompt[i:i + 1]) for i in range(40)])
    diff2 = float((one[:40] - OracleV41(W, "exact", stale_index_k=False).forward(prompt[:40])).abs().max())
    diff3 = float((steps - OracleV41(W, "exact", stale_index_k=False).forward(prompt[:40])).abs().max())
    print(f"token-by-token-vs-oneshot (40 tok) max|dlogit| = {diff3:.3e}; prefix consistency {diff2:.3e}")
    assert diff3 < 1e-3, diff3

    cdir = os.path.join(a.out, "cases")
    os.makedirs(cdir, exist_ok=True)
    summary = {}
    for T in PROMPT_LENS:
        prompt = torch.from_numpy(rng.integers(3, V, size=T)).long()
        out, meta = {"prompt_ids": prompt.numpy().astype(np.int64)}, {"format": "pt", "seed": a.seed}
        for mode, pfx in (("exact", ""), ("reference", "ref.")):
            logits, hidden, ids, dl, stats = run_case(W, mode, prompt)
            out[pfx + "prefill_logits"] = logits.numpy()
            out[pfx + "decode_ids"] = ids.numpy().astype(np.int64)
            out[pfx + "decode_logits"] = dl.numpy()
            if mode == "exact":
                first = 0 if T <= HIDDEN_FULL_MAX else T - HIDDEN_TAIL
                meta["hidden_first_row"] = str(first)
                for L, X in enumerate(hidden):
                    out[f"hidden.{L}"] = rf.st_bf16(X[first:].numpy())
            mp, md = margin(logits), margin(dl)
            meta[pfx + "min_margin_prefill"] = f"{mp:.6f}"
            meta[pfx + "min_margin_decode"] = f"{md:.6f}"
            for k, v in stats.items():
                meta[pfx + k] = str(v)
            summary[f"p{T}.{mode}"] = (mp, md, stats)
            print(f"p{T} {mode:9s}: min margin prefill {mp:.4f} decode {md:.4f} ids[:8] {ids[:8].tolist()} {stats}")
        # sensitivity: reference mode with float64 GEMM accumulation instead of float32
        r64 = OracleV41(W, "reference", gemm64=True).forward(prompt)
        rd = np.abs(r64.numpy() - out["ref.prefill_logits"])
        meta["ref_gemm64_prefill_max_abs_diff"] = f"{float(rd.max()):.6f}"
        meta["ref_gemm64_prefill_argmax_agree"] = f"{float((r64.argmax(-1).numpy() == out['ref.prefill_logits'].argmax(-1)).mean()):.4f}"
        print(f"p{T}: reference fp32-vs-fp64 GEMM prefill max|d| {meta['ref_gemm64_prefill_max_abs_diff']} "
              f"argmax agree {meta['ref_gemm64_prefill_argmax_agree']}")
        # stale-quirk and ref-vs-exact information
        _, _, ids_ns, dl_ns, _ = run_case(W, "exact", prompt, stale=False)
        meta["exact_nonstale_decode_max_abs_diff"] = f"{float((dl_ns - torch.from_numpy(out['decode_logits'])).abs().max()):.6f}"
        meta["ref_vs_exact_prefill_max_abs_diff"] = (
            f"{float(np.abs(out['ref.prefill_logits'] - out['prefill_logits']).max()):.6f}")
        meta["ref_exact_same_decode_ids"] = str(bool((out["ref.decode_ids"] == out["decode_ids"]).all()))
        print(f"p{T}: stale-vs-nonstale decode max|d| {meta['exact_nonstale_decode_max_abs_diff']}, "
              f"ref-vs-exact prefill max|d| {meta['ref_vs_exact_prefill_max_abs_diff']}, "
              f"same greedy ids {meta['ref_exact_same_decode_ids']}")
        rf.write_safetensors(os.path.join(cdir, f"p{T}.safetensors"), out, meta)
    total = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(a.out) for f in fs)
    print(f"fixture dir size {total / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
