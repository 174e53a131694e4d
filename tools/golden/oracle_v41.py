"""Golden oracle for DeepSeek-V4.1-Flash (`deepseek_v41`) text forward, plain PyTorch on CPU.

Our own transcription of the DeepSeek reference (inference/model.py + kernel.py, revision dba1be0a) as
described in /work/shared/specs/deepseek-v4.md sections 1.2, 1.3, 2.1, 2.3, 3, 5.1-5.4, 6, 7.
PyPI Transformers (5.25.0) has no deepseek_v41, so nothing here is imported from it.

Two numerics modes:
  exact      float32 everywhere, no fake quant, no activation quant; weights = dequantized release weights.
  reference  the reference's roundings: BF16 activations between ops, fp32 norms/softmax/router/HC,
             FP8 activation quant (block 32, ue8m0) before FP8/FP4 GEMMs, fake-FP8 window KV, fake-FP4
             compressed KV (e4m3 scales per 16), fake-FP4 indexer q/k (ue8m0 per 32), BF16 indexer scores,
             P cast to BF16 before PV.  See tools/golden/ORACLE_V41.md for every rounding point.

All tensors live in float32 containers; `self.R(x)` rounds to BF16 (reference mode) or is the identity.
The model is stateful: `forward(ids)` runs the next chunk (prefill of any length, or one decode token)
at positions self.pos .. self.pos+T-1.  Chunked prefill is supported (a generalisation: the reference
only prefills at start_pos 0 and decodes one token at a time).
"""
from __future__ import annotations

import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import release_format as rf  # noqa: E402

F32 = torch.float32
NEG_INF = float("-inf")
DEAD = -1  # Engram history value of an image position


# ============================================================================ Engram constants (spec 5.4)

def _isprime(n: int) -> bool:
    from sympy import isprime
    return bool(isprime(n))


def engram_primes(n_layers: int, max_ngram: int, n_heads: int, engram_vocab_size: int):
    """primes[layer][ngram-2][head]: next unused prime above the running candidate, the search restarting
    at engram_vocab_size-1 for each (layer, n-gram size), drawn in order layer, n-gram size, head."""
    seen, out = set(), []
    for _ in range(n_layers):
        per = []
        for _ in range(max_ngram - 1):
            cur, sizes = engram_vocab_size - 1, []
            for _ in range(n_heads):
                c = cur + 1
                while not _isprime(c) or c in seen:
                    c += 1
                seen.add(c)
                sizes.append(c)
                cur = c
            per.append(sizes)
        out.append(per)
    return out


def engram_multipliers(layer_ids, max_ngram: int, compressed_vocab: int) -> np.ndarray:
    """[n_layers, max_ngram] int64: default_rng(10007*layer).integers(0, B, max_ngram)*2+1,
    B = max(1, ((2^63-1) // compressed_vocab) // 2)."""
    bound = max(1, (np.iinfo(np.int64).max // compressed_vocab) // 2)
    rows = []
    for lid in layer_ids:
        g = np.random.default_rng(10007 * lid)
        rows.append(g.integers(low=0, high=bound, size=(max_ngram,), dtype=np.int64) * 2 + 1)
    return np.stack(rows)


def engram_layout(tc: dict):
    """(primes [nl][ng-1][heads], flat offsets [nl][cols], table rows [nl]) from a text_config dict."""
    primes = engram_primes(len(tc["engram_layer_ids"]), tc["engram_max_ngram_size"], tc["engram_n_heads"],
                           tc["engram_vocab_size"])
    offsets, rows = [], []
    for layer in primes:
        flat = [p for per in layer for p in per]
        offsets.append(list(np.cumsum([0] + flat[:-1]).astype(np.int64)))
        rows.append(int(sum(flat)))
    return primes, offsets, rows


# ============================================================================ numeric primitives (spec 3)

def bf16(x: torch.Tensor) -> torch.Tensor:
    """Round to BF16 (RNE), keep a float32 container."""
    return x.to(torch.bfloat16).to(F32)


def pow2ceil(v: torch.Tensor) -> torch.Tensor:
    """2^ceil(log2 v) from the fp32 bit pattern: exponent-127, +1 if the mantissa is non-zero."""
    bits = v.contiguous().view(torch.int32)
    e = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return torch.exp2(e.to(F32))


_INV448 = torch.tensor(1.0 / 448.0, dtype=F32)
_INV6 = torch.tensor(1.0 / 6.0, dtype=F32)
_E2M1_VALS = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=F32)
_E2M1_B = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=F32)
_E2M1_UP = torch.tensor([False, True, False, True, False, True, False])  # tie goes up (to the even code)


def e2m1_rne(q: torch.Tensor) -> torch.Tensor:
    """Round values already clamped to [-6,6] to the e2m1 grid, ties to the even code."""
    m = q.abs().unsqueeze(-1)
    code = torch.where(_E2M1_UP, m >= _E2M1_B, m > _E2M1_B).sum(-1)
    return torch.copysign(_E2M1_VALS[code], q)


def fake_fp8(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """act_quant: per block a=max(amax,1e-4), s=pow2ceil(a*fp32(1/448)), e4m3_rne(clamp(x/s,+-448))*s."""
    sh = x.shape
    b = x.reshape(*sh[:-1], sh[-1] // block, block)
    a = b.abs().amax(-1, keepdim=True).clamp_min(1e-4)
    s = pow2ceil(a * _INV448)
    q = (b / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).to(F32)
    return (q * s).reshape(sh)


def fake_fp4_ue8m0(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """fp4_act_quant, ue8m0: a=max(amax,6*2^-126), s=pow2ceil(a*fp32(1/6)), e2m1_rne(clamp(x/s,+-6))*s."""
    sh = x.shape
    b = x.reshape(*sh[:-1], sh[-1] // block, block)
    a = b.abs().amax(-1, keepdim=True).clamp_min(6 * 2.0 ** -126)
    s = pow2ceil(a * _INV6)
    return (e2m1_rne((b / s).clamp(-6.0, 6.0)) * s).reshape(sh)


def fake_fp4_e4m3(x: torch.Tensor, block: int = 16) -> torch.Tensor:
    """fp4_act_quant, e4m3 scales (compressed KV): a=max(amax,6*2^-9), s=fp32(e4m3_rne(min(a/6,448))),
    e2m1_rne(clamp(x/s,+-6))*s.  (The saturation at 448 is our choice; never reached by RMS-normed latents.)"""
    sh = x.shape
    b = x.reshape(*sh[:-1], sh[-1] // block, block)
    a = b.abs().amax(-1, keepdim=True).clamp_min(6 * 2.0 ** -9)
    s = (a / 6.0).clamp(max=448.0).to(torch.float8_e4m3fn).to(F32)
    return (e2m1_rne((b / s).clamp(-6.0, 6.0)) * s).reshape(sh)


def stable_topk_desc(s: torch.Tensor, k: int):
    """Top-k along the last dim, descending, ties (including -inf ties) broken by LOWER index first."""
    v, i = torch.sort(s, dim=-1, descending=True, stable=True)
    return v[..., :k], i[..., :k]


def rope_table(dim: int, maxlen: int, base: float, yarn: dict | None):
    """precompute_freqs_cis in fp32: freqs = 1/(base^(arange(0,dim,2)/dim)); YaRN ramp when yarn given;
    angle = fp32(pos * freq); returns (cos, sin) [maxlen, dim/2] fp32."""
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=F32) / dim))
    if yarn is not None:
        orig, factor = yarn["original_max_position_embeddings"], yarn["factor"]

        def corr(rot):
            return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))

        low = max(math.floor(corr(yarn["beta_fast"])), 0)
        high = min(math.ceil(corr(yarn["beta_slow"])), dim - 1)
        ramp = ((torch.arange(dim // 2, dtype=F32) - low) / max(high - low, 1e-3)).clamp(0, 1)
        smooth = 1 - ramp
        freqs = freqs / factor * (1 - smooth) + freqs * smooth
    ang = torch.outer(torch.arange(maxlen), freqs)
    return torch.cos(ang), torch.sin(ang)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """Interleaved pairs (2i, 2i+1) of the last 2*cos.shape[-1] channels; cos/sin broadcast [T, 1?, rd/2].
    (a + ib)(c + id): re = a*c - b*d, im = a*d + b*c, fp32.  Returns the full vector (not rounded)."""
    rd = cos.shape[-1] * 2
    r = x[..., -rd:]
    a, b = r[..., 0::2], r[..., 1::2]
    if inverse:
        sin = -sin
    out = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)
    return torch.cat([x[..., :-rd], out], dim=-1)


# ============================================================================ weights

class Weights:
    """Effective (dequantized) float32 weights + the GEMM kind of every linear."""

    def __init__(self, model_dir: str):
        self.cfg = json.load(open(os.path.join(model_dir, "config.json")))
        raw = rf.read_checkpoint(model_dir)
        if all(k.startswith("model.") for k in raw):
            raw = {k[len("model."):]: v for k, v in raw.items()}
        self.w, self.kind = {}, {}
        for name, st in raw.items():
            if name.endswith(".scale"):
                continue
            base = name[: -len(".weight")] if name.endswith(".weight") else name
            if st.dtype == "F8_E4M3":
                sc = raw[base + ".scale"].data
                if name.startswith("layers.") and ".engram.embed" in name:
                    v = rf.e4m3_decode(st.data).reshape(st.data.shape[0], -1, 32) * rf.e8m0_decode(sc)[..., None]
                    v = v.reshape(st.data.shape)
                else:
                    v = rf.dequantize_fp8_block(st.data, sc, 32)
                self.kind[base] = "fp8"
            elif st.dtype == "I8":
                v = rf.dequantize_mxfp4(st.data.view(np.uint8), raw[base + ".scale"].data, 32)
                self.kind[base] = "fp4"
            else:
                v = rf.stensor_to_float32(st)
                self.kind[base] = st.dtype.lower()
            self.w[name] = torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32))
        tm, _ = rf.read_safetensors(os.path.join(model_dir, "engram_token_map.safetensors"))
        self.token_map = torch.from_numpy(tm["engram_token_map"].data.astype(np.int64))

    def __getitem__(self, k):
        return self.w[k]

    def __contains__(self, k):
        return k in self.w


# ============================================================================ the model

class OracleV41:
    def __init__(self, model_dir: str, mode: str = "exact", stale_index_k: bool = True, maxlen: int = 2048,
                 gemm64: bool = False):
        """gemm64: run the linear layers' products in float64 (same roundings around them) -- only used to
        measure how sensitive the fixtures are to GEMM accumulation order."""
        assert mode in ("exact", "reference")
        self.gemm64 = gemm64
        self.mode, self.ref, self.stale = mode, mode == "reference", stale_index_k
        self.W = Weights(model_dir) if isinstance(model_dir, str) else model_dir
        tc = self.W.cfg["text_config"]
        self.tc = tc
        self.L = tc["num_hidden_layers"]
        self.d, self.H, self.D, self.rd = tc["hidden_size"], tc["num_attention_heads"], tc["head_dim"], tc["qk_rope_head_dim"]
        self.G, self.olr = tc["o_groups"], tc["o_lora_rank"]
        self.win = tc["sliding_window"]
        self.ratios = tc["compress_ratios"][: self.L]
        self.kv_src, self.idx_src = set(tc["kv_source_layer_ids"]), set(tc["index_source_layer_ids"])
        self.cand_src = tc.get("candidate_source_layer_id", -1)
        self.eps, self.hc, self.hc_eps, self.iters = tc["rms_norm_eps"], tc["hc_mult"], tc["hc_eps"], tc["hc_sinkhorn_iters"]
        self.hi, self.hd = tc["index_n_heads"], tc["index_head_dim"]
        self.main_rope = rope_table(self.rd, maxlen, float(tc["rope_theta"]), None)
        self.comp_rope = rope_table(self.rd, maxlen, float(tc["compress_rope_theta"]), tc["rope_scaling"])
        # engram
        self.eng_ids = list(tc.get("engram_layer_ids", []))
        if self.eng_ids:
            primes, offsets, rows = engram_layout(tc)
            assert rows == list(tc["engram_num_embeddings"]), (rows, tc["engram_num_embeddings"])
            self.eng_primes = torch.tensor(primes, dtype=torch.int64)  # [nl, ng-1, heads]
            self.eng_offsets = torch.tensor(np.array(offsets), dtype=torch.int64)  # [nl, cols]
            self.eng_mult = torch.from_numpy(engram_multipliers(self.eng_ids, tc["engram_max_ngram_size"],
                                                                tc["engram_compressed_vocab_size"]))
            assert int(self.W.token_map.max()) + 1 == tc["engram_compressed_vocab_size"]
            self.eng_pad = int(self.W.token_map[tc["engram_pad_token_id"]])
        self.reset()

    # ------------------------------------------------------------------ state
    def reset(self):
        self.pos = 0
        self.hist = []  # compressed token ids of every position so far (Engram n-gram history)
        self.ring = [torch.zeros(self.win, self.D) for _ in range(self.L)]
        self.ckv_state = {L: (torch.zeros(self.ratios[L], self.D), torch.full((self.ratios[L], self.D), NEG_INF))
                          for L in self.kv_src if self.ratios[L] > 1}
        self.ckv = {L: torch.zeros(0, self.D) for L in self.kv_src}  # compressed KV entries (post-RoPE, fake fp4)
        self.idxk = {L: torch.zeros(0, self.hd) for L in self.kv_src}  # indexer keys
        self.shared = {"compress_kv": None, "index_k": None, "topk_idxs": None, "candidates": None}
        self.stats = {"topk_boundary_ties": 0, "cand_boundary_ties": 0, "router_ties": 0, "visible_masked_picks": 0,
                      "swiglu_clamped": 0}

    # ------------------------------------------------------------------ helpers
    def R(self, x):
        return bf16(x) if self.ref else x

    def mm(self, x, w):
        return (x.double() @ w.double().T).float() if self.gemm64 else x @ w.T

    def lin(self, name: str, x: torch.Tensor) -> torch.Tensor:
        w, kind = self.W[name + ".weight"], self.W.kind[name]
        if kind in ("fp8", "fp4"):
            xa = fake_fp8(x, 32) if self.ref else x
            return self.R(self.mm(xa, w))
        if kind == "bf16":
            return self.R(self.mm(x, w))
        raise ValueError(kind)

    def norm(self, name: str, x: torch.Tensor) -> torch.Tensor:
        y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + self.eps)
        return self.R(self.W[name + ".weight"] * y)

    # ------------------------------------------------------------------ mHC
    def hc_mixes(self, X, pfx):
        hc = self.hc
        xf = X.flatten(1)
        rs = torch.rsqrt(xf.square().mean(-1, keepdim=True) + self.eps)
        mixes = (xf @ self.W[pfx + "_fn"].T) * rs
        sc, base = self.W[pfx + "_scale"], self.W[pfx + "_base"]
        pre = torch.sigmoid(mixes[:, :hc] * sc[0] + base[:hc]) + self.hc_eps
        post = 2 * torch.sigmoid(mixes[:, hc:2 * hc] * sc[1] + base[hc:2 * hc])
        comb = (mixes[:, 2 * hc:] * sc[2] + base[2 * hc:]).unflatten(-1, (hc, hc))
        comb = comb.softmax(-1) + self.hc_eps
        comb = comb / (comb.sum(-2, keepdim=True) + self.hc_eps)
        for _ in range(self.iters - 1):
            comb = comb / (comb.sum(-1, keepdim=True) + self.hc_eps)
            comb = comb / (comb.sum(-2, keepdim=True) + self.hc_eps)
        return pre, post, comb

    def collapse(self, X, pre):
        return self.R((pre.unsqueeze(-1) * X).sum(1))

    def expand(self, y, X, post, comb):
        mixed = (comb.unsqueeze(-1) * X.unsqueeze(2)).sum(1)  # sum over the FIRST comb index j
        return self.R(post.unsqueeze(-1) * y.unsqueeze(1) + mixed)

    # ------------------------------------------------------------------ Engram
    def ngram_hashes(self, ids, image_mask=None):
        """[T, n_engram_layers, (ng-1)*heads] row ids for the new tokens (history kept in self.hist). Image
        positions enter the history as DEAD (-1): no n-gram reaches across one (reference NgramHashState)."""
        cmp = self.W.token_map[torch.as_tensor(ids, dtype=torch.int64)]
        if image_mask is not None:
            cmp = torch.where(image_mask, torch.full_like(cmp, DEAD), cmp)
        self.hist.extend(cmp.tolist())
        hist = torch.tensor(self.hist, dtype=torch.int64)
        p0, T = self.pos, len(ids)
        positions = torch.arange(p0, p0 + T)
        toks, blocked = [], torch.zeros(T, dtype=torch.bool)
        for shift in range(self.tc["engram_max_ngram_size"]):
            src = hist[(positions - shift).clamp_min(0)]
            blocked = blocked | (positions < shift) | (src == DEAD)
            toks.append(torch.where(blocked, torch.full_like(src, self.eng_pad), src))
        toks = torch.stack(toks, -1)  # [T, ng]
        prod = toks.unsqueeze(1) * self.eng_mult  # [T, nl, ng]
        roll, out = prod[..., 0], []
        for i in range(1, prod.shape[-1]):
            roll = torch.bitwise_xor(roll, prod[..., i])
            out.append(roll.unsqueeze(-1) % self.eng_primes[:, i - 1])
        return torch.cat(out, -1) + self.eng_offsets

    def engram(self, L, X, rows, image_mask=None):
        p = f"layers.{L}.engram."
        e = self.W[p + "embed.weight"][rows].flatten(1)  # dequantized fp8 rows (exact in bf16)
        kv = self.lin(p + "wkv", e)
        d, hc = self.d, self.hc
        key, value = kv[:, : hc * d].unflatten(-1, (hc, d)), kv[:, hc * d:]
        wgt = self.W[p + "q_weight"] * self.W[p + "k_weight"]
        rstd = torch.rsqrt(X.square().mean(-1) + self.eps) * torch.rsqrt(key.square().mean(-1) + self.eps)
        dot = (X * wgt * key).sum(-1) * rstd * d ** -0.5
        gate = torch.sigmoid(torch.copysign(dot.abs().clamp_min(1e-6).sqrt(), dot))
        if image_mask is not None:  # image positions get no Engram contribution
            gate = gate.masked_fill(image_mask.unsqueeze(-1), 0.0)
        return self.R(X + gate.unsqueeze(-1) * value.unsqueeze(1))

    # ------------------------------------------------------------------ attention pieces
    def rope_of(self, L):
        return self.comp_rope if self.ratios[L] else self.main_rope

    def compressor(self, L, x, p):
        """New latents (pre-RoPE, normed) and their group indices, or (None, None)."""
        pfx = f"layers.{L}.attn.compressor."
        r, T = self.ratios[L], x.shape[0]
        if r == 1:
            return self.norm(pfx + "norm", self.lin(pfx + "wkv", x)), torch.arange(p, p + T)
        kv = x @ self.W[pfx + "wkv.weight"].T  # fp32 weights, fp32 products
        sc = x @ self.W[pfx + "wgate.weight"].T
        st_kv, st_sc = self.ckv_state[L]
        ents, gs = [], []
        for i in range(T):
            t = p + i
            st_kv[t % r], st_sc[t % r] = kv[i], sc[i]
            if (t + 1) % r == 0:
                ents.append((st_kv * st_sc.softmax(0)).sum(0))
                gs.append(t // r)
        if not ents:
            return None, None
        lat = self.norm(pfx + "norm", self.R(torch.stack(ents)))
        return lat, torch.tensor(gs)

    def indexer(self, L, x, cq, latent, gs, p):
        pfx = f"layers.{L}.attn.indexer."
        r, T, end = self.ratios[L], x.shape[0], p + x.shape[0]
        cos, sin = self.comp_rope
        if L in self.kv_src:
            if latent is not None:
                k = self.norm(pfx + "k_norm", self.lin(pfx + "wk", latent))
                pos = gs * r
                k = self.R(rope(k, cos[pos], sin[pos]))
                if self.ref:
                    k = fake_fp4_ue8m0(k, 32)
                assert self.idxk[L].shape[0] == int(gs[0])
                self.idxk[L] = torch.cat([self.idxk[L], k])
                self.shared["index_k"] = L
            elif not self.stale:
                self.shared["index_k"] = L
        q = self.lin(pfx + "wq_b", cq).unflatten(-1, (self.hi, self.hd))
        q = self.R(rope(q, cos[p:end].unsqueeze(1), sin[p:end].unsqueeze(1)))
        if self.ref:
            q = fake_fp4_ue8m0(q, 32)
        n = end // r
        K = self.idxk[self.shared["index_k"]]
        assert K.shape[0] >= n, (L, K.shape, n)
        K = K[:n]
        w = self.R(self.lin(pfx + "weights_proj", x) * torch.tensor(self.hd ** -0.5 * self.hi ** -0.5, dtype=F32))
        s = self.R(torch.einsum("thd,nd->thn", q, K))
        s = self.R(s.relu() * w.unsqueeze(-1))
        s = self.R(s.sum(1))  # [T, n]
        clen = (torch.arange(p + 1, end + 1) // r).unsqueeze(-1)  # [T,1]
        s = s.masked_fill(torch.arange(n) >= clen, NEG_INF)
        if L == self.cand_src:
            self.shared["candidates"] = self.select_candidate_blocks(s, clen)
        elif 0 <= self.cand_src < L:
            s = s.masked_fill(~self.shared["candidates"], NEG_INF)
        k = min(self.tc["index_topk"], n)
        v, idx = stable_topk_desc(s, k)
        if k < n:
            nxt = torch.sort(s, dim=-1, descending=True, stable=True).values[:, k]
            self.stats["topk_boundary_ties"] += int(((v[:, -1] == nxt) & torch.isfinite(nxt)).sum())
        self.stats["visible_masked_picks"] += int(((v == NEG_INF) & (idx < clen)).sum())
        idx = idx.sort(-1).values
        return torch.where(idx < clen, idx, -1)

    def select_candidate_blocks(self, s, clen):
        bs, tk = self.tc["candidate_block_size"], self.tc["candidate_topk_blocks"]
        n = s.shape[-1]
        sc = F.pad(s, (0, -n % bs), value=NEG_INF).unflatten(-1, (-1, bs)).amax(-1)
        nb = sc.shape[-1]
        last = torch.div(clen - 1, bs, rounding_mode="floor")
        sc = sc.masked_fill(torch.arange(nb) == last, float("inf"))
        k = min(tk, nb)
        v, i = stable_topk_desc(sc, k)
        if k < nb:
            nxt = torch.sort(sc, dim=-1, descending=True, stable=True).values[:, k]
            self.stats["cand_boundary_ties"] += int(((v[:, -1] == nxt) & torch.isfinite(nxt)).sum())
        keep = torch.zeros_like(sc, dtype=torch.bool).scatter_(-1, i, v > NEG_INF)
        return keep.repeat_interleave(bs, -1)[:, :n]

    def attention(self, L, x, p):
        pfx = f"layers.{L}.attn."
        T, H, D, end = x.shape[0], self.H, self.D, p + x.shape[0]
        cos, sin = self.rope_of(L)
        c_t, s_t = cos[p:end], sin[p:end]
        cq = self.norm(pfx + "q_norm", self.lin(pfx + "wq_a", x))
        q = self.lin(pfx + "wq_b", cq).unflatten(-1, (H, D))
        q = self.R(rope(q, c_t.unsqueeze(1), s_t.unsqueeze(1)))
        kv = self.norm(pfx + "kv_norm", self.lin(pfx + "wkv", x))
        kv = self.R(rope(kv, c_t, s_t))
        if self.ref:
            kv = fake_fp8(kv, 32)
        # window: previous positions from the ring (max(0,p-W+1)..p-1) + this chunk
        prev = list(range(max(0, p - self.win + 1), p))
        ring = self.ring[L]
        wpos = torch.tensor(prev + list(range(p, end)), dtype=torch.int64)
        wkv = torch.cat([ring[torch.tensor(prev, dtype=torch.int64) % self.win], kv]) if prev else kv
        tpos = torch.arange(p, end).unsqueeze(-1)
        wvalid = (wpos <= tpos) & (wpos > tpos - self.win)  # [T, Nw]
        for i in range(max(0, T - self.win), T):
            ring[(p + i) % self.win] = kv[i]
        # compressed
        csel = torch.zeros(T, 0, D)
        cvalid = torch.zeros(T, 0, dtype=torch.bool)
        r = self.ratios[L]
        if r:
            clen_end = end // r
            latent = gs = None
            if L in self.kv_src:
                latent, gs = self.compressor(L, x, p)
                self.shared["compress_kv"] = L
            if L in self.idx_src:
                idxs = (torch.zeros(T, 0, dtype=torch.int64) if clen_end == 0
                        else self.indexer(L, x, cq, latent, gs, p))
                self.shared["topk_idxs"] = idxs
            else:
                idxs = self.shared["topk_idxs"]
            if latent is not None:
                pos = gs * r
                lat = self.R(rope(latent, cos[pos], sin[pos]))
                if self.ref:
                    lat = fake_fp4_e4m3(lat, 16)
                assert self.ckv[L].shape[0] == int(gs[0])
                self.ckv[L] = torch.cat([self.ckv[L], lat])
            ckv = self.ckv[self.shared["compress_kv"]][:clen_end]
            assert idxs.shape[0] == T
            cvalid = idxs >= 0
            csel = ckv[idxs.clamp_min(0)] if idxs.shape[1] else csel
        # sparse attention with sink
        scale = D ** -0.5
        lw = torch.einsum("thd,nd->thn", q, wkv) * scale
        lw = lw.masked_fill(~wvalid.unsqueeze(1), NEG_INF)
        lc = torch.einsum("thd,tkd->thk", q, csel) * scale
        lc = lc.masked_fill(~cvalid.unsqueeze(1), NEG_INF)
        m = torch.maximum(lw.amax(-1), lc.amax(-1) if lc.shape[-1] else torch.full_like(lw[..., 0], NEG_INF))
        m = m.clamp_min(-1e30).unsqueeze(-1)
        pw, pc = torch.exp(lw - m), torch.exp(lc - m)
        sink = self.W[pfx + "attn_sink"].view(1, H, 1)
        denom = pw.sum(-1, keepdim=True) + pc.sum(-1, keepdim=True) + torch.exp(sink - m)
        num = torch.einsum("thn,nd->thd", self.R(pw), wkv) + torch.einsum("thk,tkd->thd", self.R(pc), csel)
        o = self.R(num / denom)
        o = self.R(rope(o, c_t.unsqueeze(1), s_t.unsqueeze(1), inverse=True))
        og = o.reshape(T, self.G, -1)
        wa = self.W[pfx + "wo_a.weight"].view(self.G, self.olr, -1)
        z = self.R(torch.einsum("tgd,grd->tgr", og, wa))
        return self.lin(pfx + "wo_b", z.flatten(1))

    # ------------------------------------------------------------------ MoE
    def expert(self, pfx, x, w=None):
        lim = self.tc["swiglu_limit"]
        g, u = self.lin(pfx + "w1", x), self.lin(pfx + "w3", x)
        if lim > 0:
            self.stats["swiglu_clamped"] += int((u.abs() > lim).sum() + (g > lim).sum())
            u = u.clamp(-lim, lim)
            g = g.clamp(max=lim)
        h = F.silu(g) * u
        if w is not None:
            h = w * h
        return self.lin(pfx + "w2", self.R(h))

    def moe(self, L, x, image_mask=None):
        pfx = f"layers.{L}.ffn."
        sc = F.softplus(x @ self.W[pfx + "gate.weight"].T).sqrt()
        k = self.tc["num_experts_per_tok"]
        bias = self.W[pfx + "gate.bias"]
        if image_mask is not None:  # image positions select with bias_vl
            bias = torch.where(image_mask.unsqueeze(-1), self.W[pfx + "gate.bias_vl"], bias)
        biased = sc + bias
        v, idx = stable_topk_desc(biased, k)
        if k < biased.shape[-1]:
            nxt = torch.sort(biased, dim=-1, descending=True, stable=True).values[:, k]
            self.stats["router_ties"] += int((v[:, -1] == nxt).sum())
        wts = sc.gather(1, idx)
        if self.tc.get("norm_topk_prob", True) and k > 1:
            wts = wts / (wts.sum(-1, keepdim=True) + 1e-20)
        wts = wts * self.tc["routed_scaling_factor"]
        y = torch.zeros_like(x)
        for e in range(self.tc["n_routed_experts"]):
            tok, slot = torch.where(idx == e)
            if tok.numel():
                y[tok] += self.expert(f"{pfx}experts.{e}.", x[tok], wts[tok, slot, None])
        y = y + self.expert(pfx + "shared_experts.", x)
        return self.R(y)

    # ------------------------------------------------------------------ top level
    @torch.no_grad()
    def forward(self, ids, return_hidden: bool = False, image_mask=None, image_rows=None):
        """image_mask [T] bool marks image positions, whose embeddings are image_rows [n_image, d] (reference
        Transformer.forward with token_types >= 0 and merge_image_embeddings)."""
        ids = torch.as_tensor(ids, dtype=torch.int64).view(-1)
        T, p = ids.numel(), self.pos
        if image_mask is not None:
            image_mask = torch.as_tensor(image_mask, dtype=torch.bool).view(-1)
        hashes = self.ngram_hashes(ids.tolist(), image_mask) if self.eng_ids else None
        h = self.W["embed.weight"][ids].clone()
        if image_mask is not None:
            h[image_mask] = self.R(torch.as_tensor(image_rows, dtype=F32))
        X = h.unsqueeze(1).repeat(1, self.hc, 1)
        pre = torch.zeros(T, self.hc)
        pre[:, 0] = 1.0
        hidden = []
        for L in range(self.L):
            if L in self.eng_ids:
                X = self.engram(L, X, hashes[:, self.eng_ids.index(L)], image_mask)
            pa, qa, ca = self.hc_mixes(X, f"layers.{L}.hc_attn")
            x = self.norm(f"layers.{L}.attn_norm", self.collapse(X, pre))
            X = self.expand(self.attention(L, x, p), X, qa, ca)
            pf, qf, cf = self.hc_mixes(X, f"layers.{L}.hc_ffn")
            x = self.norm(f"layers.{L}.ffn_norm", self.collapse(X, pa))
            X = self.expand(self.moe(L, x, image_mask), X, qf, cf)
            pre = pf
            if return_hidden:
                hidden.append(X.clone())
        hf = self.norm("norm", self.collapse(X, pre))
        logits = hf @ self.W["head.weight"].T
        self.pos += T
        return (logits, hidden) if return_hidden else logits
