"""The demo model's config.json (nested like the released V4.1, spec §1.2), sized for a <= ~50 MB checkpoint."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "golden"))
from oracle_v41 import engram_layout  # noqa: E402


def make_config(vocab: int, compressed_vocab: int, image_token_id: int, tiny: bool = False) -> dict:
    """10 layers: 0,1 window only (Engram at 1); 2 ratio-2 full source; 3 reuse; 4 full source (+Engram); 5 reuse;
    6 ratio-1 full + candidate source; 7 reuse; 8 reindex; 9 reuse.  `tiny` shrinks widths for CPU tests."""
    d, I, H, E = (64, 32, 2, 8) if tiny else (256, 128, 8, 32)
    tc = dict(
        model_type="deepseek_v41_text", vocab_size=vocab, hidden_size=d, moe_intermediate_size=I,
        num_hidden_layers=10, num_attention_heads=H, num_key_value_heads=1, head_dim=128, qk_rope_head_dim=64,
        q_lora_rank=128, o_lora_rank=128, o_groups=2 if tiny else 4, hidden_act="silu", swiglu_limit=10.0,
        rms_norm_eps=1e-20, attention_bias=False, tie_word_embeddings=False, max_position_embeddings=1048576,
        rope_theta=10000,
        rope_scaling=dict(rope_type="yarn", factor=16, beta_fast=32, beta_slow=1, original_max_position_embeddings=65536),
        n_routed_experts=E, n_shared_experts=1, num_experts_per_tok=4 if not tiny else 2, scoring_func="sqrtsoftplus",
        topk_method="noaux_tc", norm_topk_prob=True, routed_scaling_factor=1.5, sliding_window=128 if not tiny else 16,
        compress_ratios=[0, 0, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0], compress_rope_theta=160000,
        kv_source_layer_ids=[2, 4, 6], index_source_layer_ids=[2, 4, 6, 8], index_n_heads=4, index_head_dim=128,
        index_topk=32 if not tiny else 8, candidate_source_layer_id=6, candidate_topk_blocks=8 if not tiny else 3,
        candidate_block_size=8, hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6,
        engram_layer_ids=[1, 4], engram_num_embeddings=None, engram_max_ngram_size=4,
        engram_vocab_size=6000 if not tiny else 500, engram_n_heads=2, engram_head_dim=64, engram_pad_token_id=2,
        engram_compressed_vocab_size=compressed_vocab,
        num_nextn_predict_layers=3, dspark_block_size=5, dspark_noise_token_id=5, dspark_target_layer_ids=[7, 8, 9],
        dspark_markov_rank=64, dspark_n_routed_experts=E, dspark_num_experts_per_tok=2,
    )
    tc["engram_num_embeddings"] = engram_layout(tc)[2]
    return dict(
        architectures=["DeepseekV41ForCausalLM"], model_type="deepseek_v41", dtype="bfloat16",
        bos_token_id=0, eos_token_id=1, pad_token_id=2, image_token_id=image_token_id,
        quantization_config=dict(quant_method="fp8", activation_scheme="dynamic", weight_block_size=[32, 32],
                                 scale_fmt="ue8m0", expert_dtype="fp4"),
        text_config=tc,
    )
