"""Trainable, batched PyTorch DeepSeek-V4.1 text model for the demo checkpoint.

Computes what tools/golden/oracle_v41.py computes in *exact* mode (float32, no fake quant) for a
prefill from position 0, batched over sequences and differentiable, with parameters named exactly as
the released checkpoint (without the `model.` prefix).  check_vs_oracle.py verifies the equivalence on
a random model.  Features: single-pass mHC (hc_mult 4, Sinkhorn), window attention with sinks and
grouped low-rank output, CSA2 (ratio-2 gated compressor, ratio-1 compressor, KV-source / index-source /
reuse / reindex layers, candidate blocks from the candidate source), Engram at two layers, MoE with
sqrtsoftplus routing, bias selection, shared expert, SwiGLU clamps.

Export quantization (export.py / release_format.py) can be simulated during training with
`fake_export=True` (straight-through estimator): FP8 32x32 ue8m0 blocks, MXFP4 experts, BF16 and the
Engram table's FP8 1x32 rows, exactly as the exporter rounds them.
"""
from __future__ import annotations

import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "golden"))
from oracle_v41 import engram_layout, engram_multipliers, rope, rope_table  # noqa: E402

NEG_INF = float("-inf")


# ----------------------------------------------------------------------------- export-format fake quant (STE)

def _pow2ceil(v):
    bits = v.float().contiguous().view(torch.int32)
    e = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return torch.exp2(e.float())


_E2M1_VALS = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
_E2M1_B = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
_E2M1_UP = torch.tensor([False, True, False, True, False, True, False])


def q_fp8_block(w, B=32):
    o, i = w.shape
    b = w.reshape(o // B, B, i // B, B)
    s = _pow2ceil(b.abs().amax((1, 3), keepdim=True).clamp_min(1e-4) * (1.0 / 448.0))
    return ((b / s).to(torch.float8_e4m3fn).float() * s).reshape(o, i)


def q_fp8_rows(w, B=32):
    o, i = w.shape
    b = w.reshape(o, i // B, B)
    s = _pow2ceil(b.abs().amax(-1, keepdim=True).clamp_min(1e-4) * (1.0 / 448.0))
    return ((b / s).to(torch.float8_e4m3fn).float() * s).reshape(o, i)


def q_mxfp4(w, B=32):
    *lead, i = w.shape
    b = w.reshape(*lead, i // B, B)
    s = _pow2ceil(b.abs().amax(-1, keepdim=True).clamp_min(6 * 2.0 ** -126) * (1.0 / 6.0))
    m = (b / s).abs().clamp(max=6.0).unsqueeze(-1)
    dev = w.device
    code = torch.where(_E2M1_UP.to(dev), m >= _E2M1_B.to(dev), m > _E2M1_B.to(dev)).sum(-1)
    return (torch.copysign(_E2M1_VALS.to(dev)[code], b) * s).reshape(w.shape)


def q_bf16(w):
    return w.to(torch.bfloat16).float()


def ste(w, fn):
    return w + (fn(w.detach()) - w.detach())


# ----------------------------------------------------------------------------- model

class DemoV41(nn.Module):
    def __init__(self, cfg: dict, token_map: torch.Tensor, maxlen: int = 4096):
        super().__init__()
        tc = cfg["text_config"]
        self.tc = tc
        self.L, self.d, self.H, self.D, self.rd = (tc["num_hidden_layers"], tc["hidden_size"],
                                                  tc["num_attention_heads"], tc["head_dim"], tc["qk_rope_head_dim"])
        self.G, self.olr, self.ql = tc["o_groups"], tc["o_lora_rank"], tc["q_lora_rank"]
        self.win, self.hc, self.iters = tc["sliding_window"], tc["hc_mult"], tc["hc_sinkhorn_iters"]
        self.eps, self.hc_eps = tc["rms_norm_eps"], tc["hc_eps"]
        self.ratios = tc["compress_ratios"][: self.L]
        self.kv_src, self.idx_src = list(tc["kv_source_layer_ids"]), list(tc["index_source_layer_ids"])
        self.cand_src = tc["candidate_source_layer_id"]
        self.hi, self.hd = tc["index_n_heads"], tc["index_head_dim"]
        self.E, self.I, self.topk = tc["n_routed_experts"], tc["moe_intermediate_size"], tc["num_experts_per_tok"]
        self.eng_ids = list(tc["engram_layer_ids"])
        self.fake_export = False
        self.kinds = {}  # param name -> export kind
        P = {}
        d, H, D, ql, G, olr, hc = self.d, self.H, self.D, self.ql, self.G, self.olr, self.hc
        V = tc["vocab_size"]

        def add(name, shape, kind, init):
            P[name] = init(shape)
            self.kinds[name] = kind

        def normal(std):
            return lambda s: torch.randn(*s) * std

        def const(v):
            return lambda s: torch.full(s, float(v))

        resid = 1.0 / math.sqrt(2 * self.L)
        add("embed.weight", (V, d), "bf16", normal(1.0))
        add("head.weight", (V, d), "bf16", normal(1.0 / math.sqrt(d)))
        add("norm.weight", (d,), "bf16", const(1))
        for L in range(self.L):
            p = f"layers.{L}."
            add(p + "attn_norm.weight", (d,), "bf16", const(1))
            add(p + "ffn_norm.weight", (d,), "bf16", const(1))
            add(p + "attn.wq_a.weight", (ql, d), "fp8", normal(d ** -0.5))
            add(p + "attn.q_norm.weight", (ql,), "bf16", const(1))
            add(p + "attn.wq_b.weight", (H * D, ql), "fp8", normal(ql ** -0.5))
            add(p + "attn.wkv.weight", (D, d), "fp8", normal(d ** -0.5))
            add(p + "attn.kv_norm.weight", (D,), "bf16", const(1))
            add(p + "attn.wo_a.weight", (G * olr, H * D // G), "fp8", normal((H * D // G) ** -0.5))
            add(p + "attn.wo_b.weight", (d, G * olr), "fp8", normal((G * olr) ** -0.5 * resid))
            add(p + "attn.attn_sink", (H,), "f32", const(0))
            for s in ("attn", "ffn"):
                add(p + f"hc_{s}_fn", ((2 + hc) * hc, hc * d), "f32", normal(0.01 * (hc * d) ** -0.5))
                base = torch.zeros((2 + hc) * hc)
                base[2 * hc:] = (torch.eye(hc) * 4.0).flatten()  # near-identity residual mixing
                add(p + f"hc_{s}_base", ((2 + hc) * hc,), "f32", lambda s_, b=base: b.clone())
                add(p + f"hc_{s}_scale", (3,), "f32", const(1))
            add(p + "ffn.gate.weight", (self.E, d), "bf16", normal(d ** -0.5))
            add(p + "ffn.experts.w1", (self.E, self.I, d), "fp4", normal(d ** -0.5))
            add(p + "ffn.experts.w3", (self.E, self.I, d), "fp4", normal(d ** -0.5))
            add(p + "ffn.experts.w2", (self.E, d, self.I), "fp4", normal(self.I ** -0.5 * resid))
            add(p + "ffn.shared_experts.w1.weight", (self.I, d), "fp8", normal(d ** -0.5))
            add(p + "ffn.shared_experts.w3.weight", (self.I, d), "fp8", normal(d ** -0.5))
            add(p + "ffn.shared_experts.w2.weight", (d, self.I), "fp8", normal(self.I ** -0.5 * resid))
            if L in self.kv_src:
                add(p + "attn.compressor.wkv.weight", (D, d), "bf16", normal(d ** -0.5))
                if self.ratios[L] > 1:
                    add(p + "attn.compressor.wgate.weight", (D, d), "bf16", normal(0.1 * d ** -0.5))
                add(p + "attn.compressor.norm.weight", (D,), "bf16", const(1))
                add(p + "attn.indexer.wk.weight", (self.hd, D), "bf16", normal(D ** -0.5))
                add(p + "attn.indexer.k_norm.weight", (self.hd,), "bf16", const(1))
            if L in self.idx_src:
                add(p + "attn.indexer.wq_b.weight", (self.hi * self.hd, ql), "fp8", normal(ql ** -0.5))
                add(p + "attn.indexer.weights_proj.weight", (self.hi, d), "bf16", normal(d ** -0.5))
            if L in self.eng_ids:
                rows = tc["engram_num_embeddings"][self.eng_ids.index(L)]
                ncols = (tc["engram_max_ngram_size"] - 1) * tc["engram_n_heads"] * tc["engram_head_dim"]
                add(p + "engram.embed.weight", (rows, tc["engram_head_dim"]), "fp8rows", normal(1.0))
                add(p + "engram.wkv.weight", (d * (hc + 1), ncols), "fp8", normal(ncols ** -0.5 * 0.5))
                add(p + "engram.q_weight", (hc, d), "bf16", const(1))
                add(p + "engram.k_weight", (hc, d), "bf16", const(1))
        self.params = nn.ParameterDict({k.replace(".", "__"): nn.Parameter(v) for k, v in P.items()})
        # buffers: gate bias (aux-loss-free balancing, not trained by gradients), rope tables, engram
        for L in range(self.L):
            self.register_buffer(f"gate_bias_{L}", torch.zeros(self.E))
        mc, ms = rope_table(self.rd, maxlen, float(tc["rope_theta"]), None)
        cc, cs = rope_table(self.rd, maxlen, float(tc["compress_rope_theta"]), tc["rope_scaling"])
        for n, t in dict(main_cos=mc, main_sin=ms, comp_cos=cc, comp_sin=cs).items():
            self.register_buffer(n, t, persistent=False)
        primes, offsets, rows = engram_layout(tc)
        assert rows == list(tc["engram_num_embeddings"])
        self.register_buffer("eng_primes", torch.tensor(primes, dtype=torch.int64), persistent=False)
        self.register_buffer("eng_offsets", torch.tensor(np.array(offsets), dtype=torch.int64), persistent=False)
        self.register_buffer("eng_mult", torch.from_numpy(engram_multipliers(
            self.eng_ids, tc["engram_max_ngram_size"], tc["engram_compressed_vocab_size"])), persistent=False)
        self.register_buffer("token_map", token_map.to(torch.int64), persistent=False)
        self.eng_pad = int(token_map[tc["engram_pad_token_id"]])

    # ------------------------------------------------------------------ parameter access
    QUANT = {"fp8": q_fp8_block, "fp4": q_mxfp4, "bf16": q_bf16, "fp8rows": q_fp8_rows, "f32": None}

    def W(self, name):
        w = self.params[name.replace(".", "__")]
        if self.fake_export:
            fn = self.QUANT[self.kinds[name]]
            if fn is not None:
                return ste(w, fn)
        return w

    def lin(self, name, x):
        return x @ self.W(name + ".weight").T

    def norm(self, name, x):
        return self.W(name + ".weight") * (x * torch.rsqrt(x.square().mean(-1, keepdim=True) + self.eps))

    # ------------------------------------------------------------------ mHC
    def hc_mixes(self, X, pfx):
        hc = self.hc
        xf = X.flatten(-2)
        rs = torch.rsqrt(xf.square().mean(-1, keepdim=True) + self.eps)
        mixes = (xf @ self.W(pfx + "_fn").T) * rs
        sc, base = self.W(pfx + "_scale"), self.W(pfx + "_base")
        pre = torch.sigmoid(mixes[..., :hc] * sc[0] + base[:hc]) + self.hc_eps
        post = 2 * torch.sigmoid(mixes[..., hc:2 * hc] * sc[1] + base[hc:2 * hc])
        comb = (mixes[..., 2 * hc:] * sc[2] + base[2 * hc:]).unflatten(-1, (hc, hc))
        comb = comb.softmax(-1) + self.hc_eps
        comb = comb / (comb.sum(-2, keepdim=True) + self.hc_eps)
        for _ in range(self.iters - 1):
            comb = comb / (comb.sum(-1, keepdim=True) + self.hc_eps)
            comb = comb / (comb.sum(-2, keepdim=True) + self.hc_eps)
        return pre, post, comb

    @staticmethod
    def collapse(X, pre):
        return (pre.unsqueeze(-1) * X).sum(-2)

    @staticmethod
    def expand(y, X, post, comb):
        mixed = torch.einsum("...jk,...jd->...kd", comb, X)  # sum over the FIRST comb index
        return post.unsqueeze(-1) * y.unsqueeze(-2) + mixed

    # ------------------------------------------------------------------ Engram
    def ngram_hashes(self, ids):
        """ids [B,T] (positions 0..T-1) -> [B, T, n_layers, cols] table rows."""
        cmp = self.token_map[ids]
        B, T = ids.shape
        toks = []
        for shift in range(self.tc["engram_max_ngram_size"]):
            src = F.pad(cmp, (shift, 0), value=self.eng_pad)[:, :T]
            toks.append(src)
        toks = torch.stack(toks, -1)  # [B,T,ng]
        prod = toks.unsqueeze(2) * self.eng_mult  # [B,T,nl,ng]
        roll, out = prod[..., 0], []
        for i in range(1, prod.shape[-1]):
            roll = torch.bitwise_xor(roll, prod[..., i])
            out.append(roll.unsqueeze(-1) % self.eng_primes[:, i - 1])
        return torch.cat(out, -1) + self.eng_offsets

    def engram(self, L, X, rows):
        p = f"layers.{L}.engram."
        e = F.embedding(rows, self.W(p + "embed.weight")).flatten(-2)
        kv = self.lin(p + "wkv", e)
        d, hc = self.d, self.hc
        key, value = kv[..., : hc * d].unflatten(-1, (hc, d)), kv[..., hc * d:]
        wgt = self.W(p + "q_weight") * self.W(p + "k_weight")
        rstd = torch.rsqrt(X.square().mean(-1) + self.eps) * torch.rsqrt(key.square().mean(-1) + self.eps)
        dot = (X * wgt * key).sum(-1) * rstd * d ** -0.5
        gate = torch.sigmoid(torch.copysign(dot.abs().clamp_min(1e-6).sqrt(), dot))
        return X + gate.unsqueeze(-1) * value.unsqueeze(-2)

    # ------------------------------------------------------------------ attention
    def compressor(self, L, x):
        pfx = f"layers.{L}.attn.compressor."
        r, T = self.ratios[L], x.shape[1]
        if r == 1:
            return self.norm(pfx + "norm", self.lin(pfx + "wkv", x))
        n = T // r
        kv = self.lin(pfx + "wkv", x[:, : n * r]).unflatten(1, (n, r))
        sc = self.lin(pfx + "wgate", x[:, : n * r]).unflatten(1, (n, r))
        return self.norm(pfx + "norm", (kv * sc.softmax(2)).sum(2))

    @staticmethod
    def stable_topk(s, k):
        v, i = torch.sort(s, dim=-1, descending=True, stable=True)
        return v[..., :k], i[..., :k]

    def select_candidate_blocks(self, s, clen):
        bs, tk = self.tc["candidate_block_size"], self.tc["candidate_topk_blocks"]
        n = s.shape[-1]
        sc = F.pad(s, (0, -n % bs), value=NEG_INF).unflatten(-1, (-1, bs)).amax(-1)
        nb = sc.shape[-1]
        last = torch.div(clen - 1, bs, rounding_mode="floor")
        sc = sc.masked_fill(torch.arange(nb, device=s.device) == last, float("inf"))
        v, i = self.stable_topk(sc, min(tk, nb))
        keep = torch.zeros_like(sc, dtype=torch.bool).scatter_(-1, i, v > NEG_INF)
        return keep.repeat_interleave(bs, -1)[..., :n]

    def indexer(self, L, x, cq, st):
        """Index scores [B,T,n] (masked) and selection mask [B,T,n]; also returns the scores' logits for the
        indexer distillation loss.  Inputs are detached: only indexer parameters learn from that loss."""
        pfx = f"layers.{L}.attn.indexer."
        r, T = self.ratios[L], x.shape[1]
        n = T // r
        cos, sin = self.comp_cos, self.comp_sin
        q = self.lin(pfx + "wq_b", cq).unflatten(-1, (self.hi, self.hd))
        q = rope(q, cos[:T].unsqueeze(1), sin[:T].unsqueeze(1))
        K = st["index_k"][:, :n]
        w = self.lin(pfx + "weights_proj", x) * (self.hd ** -0.5 * self.hi ** -0.5)
        s = (torch.einsum("bthd,bnd->bthn", q, K).relu() * w.unsqueeze(-1)).sum(2)
        clen = (torch.arange(1, T + 1, device=x.device) // r).view(1, T, 1)
        s = s.masked_fill(torch.arange(n, device=x.device) >= clen, NEG_INF)
        if L == self.cand_src:
            st["candidates"] = self.select_candidate_blocks(s, clen)
        elif 0 <= self.cand_src < L:
            s = s.masked_fill(~st["candidates"], NEG_INF)
        k = min(self.tc["index_topk"], n)
        with torch.no_grad():
            _, idx = self.stable_topk(s, k)
            sel = torch.zeros_like(s, dtype=torch.bool).scatter_(-1, idx, True)
            sel &= torch.arange(n, device=x.device) < clen
        return s, sel

    def attention(self, L, x, st, aux):
        pfx = f"layers.{L}.attn."
        B, T = x.shape[:2]
        H, D = self.H, self.D
        r = self.ratios[L]
        cos, sin = (self.comp_cos, self.comp_sin) if r else (self.main_cos, self.main_sin)
        c_t, s_t = cos[:T], sin[:T]
        cq = self.norm(pfx + "q_norm", self.lin(pfx + "wq_a", x))
        q = rope(self.lin(pfx + "wq_b", cq).unflatten(-1, (H, D)), c_t.unsqueeze(1), s_t.unsqueeze(1))
        kv = rope(self.norm(pfx + "kv_norm", self.lin(pfx + "wkv", x)), c_t, s_t)
        t = torch.arange(T, device=x.device)
        wvalid = (t.view(1, T) <= t.view(T, 1)) & (t.view(1, T) > t.view(T, 1) - self.win)  # [t, j]
        lw = torch.einsum("bthd,bjd->bhtj", q, kv) * D ** -0.5
        lw = lw.masked_fill(~wvalid, NEG_INF)
        logits, values = [lw], [kv]
        if r:
            n = T // r
            if L in self.kv_src:
                latent = self.compressor(L, x)  # [B,n,D] pre-RoPE
                pos = torch.arange(n, device=x.device) * r
                ix = f"layers.{L}.attn.indexer."
                kk = self.norm(ix + "k_norm", self.lin(ix + "wk", latent.detach()))
                st["index_k"] = rope(kk, self.comp_cos[pos], self.comp_sin[pos])
                st["compress_kv"] = rope(latent, self.comp_cos[pos], self.comp_sin[pos])
            if L in self.idx_src:
                s, sel = self.indexer(L, x.detach(), cq.detach(), st)
                st["sel"] = sel
            else:
                s, sel = None, st["sel"]
            ckv = st["compress_kv"][:, :n]
            lc = torch.einsum("bthd,bnd->bhtn", q, ckv) * D ** -0.5
            if s is not None and aux is not None:
                # indexer distillation (the indexer gets no gradient through top-k): target = the main
                # attention's head-summed distribution over the entries the indexer may pick
                allowed = torch.isfinite(s)  # visible (and, on reindex layers, inside the candidates)
                rows = allowed.any(-1, keepdim=True)
                with torch.no_grad():
                    tgt = lc.masked_fill(~allowed.unsqueeze(1), NEG_INF).softmax(-1).nan_to_num(0.0).sum(1)
                    tgt = tgt / tgt.sum(-1, keepdim=True).clamp_min(1e-20)
                logp = torch.where(rows, s, 0.0).masked_fill(~allowed & rows, NEG_INF).log_softmax(-1)
                kl = (tgt * (tgt.clamp_min(1e-30).log() - logp.clamp_min(-1e30))).sum(-1)
                aux.append(kl.sum() / rows.sum().clamp_min(1))
            logits.append(lc.masked_fill(~sel.unsqueeze(1), NEG_INF))
            values.append(ckv)
        sink = self.W(pfx + "attn_sink").view(1, H, 1, 1).expand(B, H, T, 1)
        p = torch.cat(logits + [sink], -1).softmax(-1)
        o = torch.einsum("bhtj,bjd->bthd", p[..., : T], kv)
        if r:
            o = o + torch.einsum("bhtn,bnd->bthd", p[..., T:-1], values[1])
        o = rope(o, c_t.unsqueeze(1), s_t.unsqueeze(1), inverse=True)
        og = o.reshape(B, T, self.G, -1)
        wa = self.W(pfx + "wo_a.weight").view(self.G, self.olr, -1)
        z = torch.einsum("btgd,grd->btgr", og, wa)
        return self.lin(pfx + "wo_b", z.flatten(-2))

    # ------------------------------------------------------------------ MoE
    def moe(self, L, x, stats):
        pfx = f"layers.{L}.ffn."
        sh = x.shape
        x = x.reshape(-1, sh[-1])
        N, k, E = x.shape[0], self.topk, self.E
        sc = F.softplus(self.lin(pfx + "gate", x)).sqrt()
        biased = sc + getattr(self, f"gate_bias_{L}")
        with torch.no_grad():
            _, idx = torch.sort(biased, dim=-1, descending=True, stable=True)
            idx = idx[:, :k]
        wts = sc.gather(1, idx)
        wts = wts / (wts.sum(-1, keepdim=True) + 1e-20) * self.tc["routed_scaling_factor"]
        lim = self.tc["swiglu_limit"]
        # capacity-free grouped dispatch: sort assignments by expert, pad to the largest load
        flat_e = idx.flatten()
        order = torch.argsort(flat_e, stable=True)
        counts = torch.bincount(flat_e, minlength=E)
        C = int(counts.max())
        starts = torch.cumsum(counts, 0) - counts
        e_sorted = flat_e[order]
        slot = torch.arange(N * k, device=x.device) - starts[e_sorted]
        tok = order // k
        buf = x.new_zeros(E, C, x.shape[1])
        buf[e_sorted, slot] = x[tok]
        w1, w3, w2 = self.W(pfx + "experts.w1"), self.W(pfx + "experts.w3"), self.W(pfx + "experts.w2")
        g = torch.bmm(buf, w1.transpose(1, 2))
        u = torch.bmm(buf, w3.transpose(1, 2))
        u = u.clamp(-lim, lim)
        g = g.clamp(max=lim)
        wbuf = x.new_zeros(E, C)
        wbuf[e_sorted, slot] = wts.flatten()[order]
        h = wbuf.unsqueeze(-1) * (F.silu(g) * u)
        out = torch.bmm(h, w2.transpose(1, 2))
        y = x.new_zeros(N, x.shape[1]).index_add_(0, tok, out[e_sorted, slot])
        gs = self.lin(pfx + "shared_experts.w1", x).clamp(max=lim)
        us = self.lin(pfx + "shared_experts.w3", x).clamp(-lim, lim)
        y = y + self.lin(pfx + "shared_experts.w2", F.silu(gs) * us)
        if stats is not None:
            probs = sc / sc.sum(-1, keepdim=True)
            stats.append((L, counts, probs.mean(0)))
        return y.reshape(sh)

    # ------------------------------------------------------------------ top level
    def forward(self, ids, stats=None, aux=None, return_hidden=False):
        B, T = ids.shape
        hashes = self.ngram_hashes(ids)
        X = self.W("embed.weight")[ids].unsqueeze(2).expand(B, T, self.hc, self.d)
        pre = torch.zeros(B, T, self.hc, device=ids.device)
        pre[..., 0] = 1.0
        st, hidden = {}, []
        for L in range(self.L):
            if L in self.eng_ids:
                X = self.engram(L, X, hashes[:, :, self.eng_ids.index(L)])
            pa, qa, ca = self.hc_mixes(X, f"layers.{L}.hc_attn")
            x = self.norm(f"layers.{L}.attn_norm", self.collapse(X, pre))
            X = self.expand(self.attention(L, x, st, aux), X, qa, ca)
            pf, qf, cf = self.hc_mixes(X, f"layers.{L}.hc_ffn")
            x = self.norm(f"layers.{L}.ffn_norm", self.collapse(X, pa))
            X = self.expand(self.moe(L, x, stats), X, qf, cf)
            pre = pf
            if return_hidden:
                hidden.append(X)
        hf = self.norm("norm", self.collapse(X, pre))
        logits = hf @ self.W("head.weight").T
        return (logits, hidden) if return_hidden else logits
