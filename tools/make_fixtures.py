#!/usr/bin/env python3
"""Build the tiny DeepSeek-V4 oracle fixtures for v4serve's golden tests.

    python3 tools/make_fixtures.py --out tests/fixtures            # all fixtures
    python3 tools/make_fixtures.py --out tests/fixtures --only tiny-kinds-fp32 tiny-bf16

Needs: torch (CPU is fine), transformers 5.17.0 (the oracle; DeepseekV4ForCausalLM),
safetensors, numpy. Deterministic: every fixture has fixed seeds, so re-running on the same
torch/transformers versions reproduces the files (logits may differ in the last ulp across
CPUs/BLAS builds; weights and prompts are bit-identical).

Each fixture directory `tests/fixtures/<name>/` holds
  * the checkpoint as published: `config.json` + `model.safetensors` (or
    `model-0000i-of-0000n.safetensors` + `model.safetensors.index.json`), in one of the three
    naming schemes of docs/checkpoint-format.md (official DeepSeek / HF mixed / HF internal);
  * `golden.safetensors`:
      prompt_ids      I64 [T]
      prefill_logits  F32 [T, V]   full-sequence forward, use_cache=False
      tokens          I64 [N]      greedy tokens, tokens[i] = argmax(decode_logits[i])
      decode_logits   F32 [N, V]   row 0 = prefill_logits[-1]; row i = logits after feeding
                                   tokens[i-1] one token at a time through HF's cache
      chunk_sizes     I64 [k]      uneven chunk sizes summing to T
      chunked_logits  F32 [T, V]   the prompt fed through HF's cache in those chunks
  * `meta.json`: description, naming scheme, dtypes, oracle versions, the oracle's
    `model.config.rope_parameters`, and self-check numbers (chunked/decode vs full forward,
    smallest indexer top-k gap, smallest greedy top-1/top-2 margin, reload check).

Every parameter is random and non-trivial (transformers zero-initialises sinks,
position_bias/ape, mHC bases, e_score_correction_bias and tid2eid; we randomise them).
The oracle always runs in float32, eager attention, on CPU. For bf16 / FP8 / MXFP4
checkpoints the oracle runs the exact dequantised values (bf16 -> fp32; FP8 e4m3 x ue8m0
128x128 block scale; MXFP4 e2m1 x ue8m0 per 32) in fp32 — what the engine must compute.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fixturelib.naming import hf_to_official, official_to_hf  # noqa: E402
from fixturelib.safetensors_io import read_header, write_safetensors  # noqa: E402

import transformers  # noqa: E402
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM  # noqa: E402

torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))

YARN = {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536, "beta_fast": 32, "beta_slow": 1}
SW, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"
RATIO_OF = {SW: 0}

# --------------------------------------------------------------------------------------
# Fixture specs
# --------------------------------------------------------------------------------------
# `hf`: kwargs for DeepseekV4Config (modern keys) — used when config_style == "hf".
# `official_config`: a config.json written in DeepSeek's published style (legacy keys) —
#  the oracle config is what transformers parses from it.

FIXTURES = {
    "tiny-kinds-fp32": dict(
        description="All three layer kinds [SWA, CSA, HCA, CSA], hash+score MoE, window 8, "
        "CSA rate 4 / HCA rate 16, index top-k 4 (selection active) with 16 index heads, "
        "YaRN compress rope, o_groups 8 > 4 heads (P9), fp32, HF default save_pretrained "
        "(mixed 'original format' names).",
        seed=1001,
        naming="hf-mixed",
        dtype="fp32",
        config_style="hf",
        hf=dict(
            vocab_size=256, hidden_size=64, num_hidden_layers=4,
            layer_types=[SW, CSA, HCA, CSA], mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe"],
            num_attention_heads=4, head_dim=32, partial_rotary_factor=0.25, q_lora_rank=32,
            o_groups=8, o_lora_rank=16, n_routed_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=48, sliding_window=8,
            compress_rates={CSA: 4, HCA: 16}, index_n_heads=16, index_head_dim=16, index_topk=4,
            hc_mult=4, hc_sinkhorn_iters=20, routed_scaling_factor=1.5, swiglu_limit=10.0,
            rope_theta=10000.0, compress_rope_theta=160000.0, rope_parameters=dict(YARN),
        ),
        prompt_len=160, n_decode=32, chunks=[5, 1, 13],
    ),
    "tiny-real-rates": dict(
        description="Real rates: window 128, CSA 4 / HCA 128, 1536-token prompt, index top-k 96 "
        "(selection active from t=387) with 16 index heads, sqrtsoftplus; layers [CSA, HCA, SWA, "
        "HCA] (one CSA, first, to keep indexer near-ties away from accumulated error; prompt chosen "
        "among 10 seeds for the largest top-k gap); official DeepSeek names and an official-style config.json (legacy keys "
        "compress_ratios incl. a trailing MTP entry, num_hash_layers, qk_rope_head_dim, "
        "rope_scaling); fp32; sharded into 2 files + index json.",
        seed=2002,
        naming="official",
        dtype="fp32",
        config_style="official",
        official_config=dict(
            vocab_size=128, hidden_size=64, num_hidden_layers=4, compress_ratios=[4, 128, 0, 128, 0],
            num_hash_layers=1, num_attention_heads=4, num_key_value_heads=1, head_dim=32,
            qk_rope_head_dim=8, q_lora_rank=32, o_groups=2, o_lora_rank=16, n_routed_experts=6,
            n_shared_experts=1, num_experts_per_tok=3, moe_intermediate_size=24, sliding_window=128,
            index_n_heads=16, index_head_dim=16, index_topk=96, hc_mult=4, hc_sinkhorn_iters=20,
            hc_eps=1e-6, rms_norm_eps=1e-6, routed_scaling_factor=2.5, scoring_func="sqrtsoftplus",
            swiglu_limit=10.0, rope_theta=10000, compress_rope_theta=160000, rope_scaling=dict(YARN),
            torch_dtype="float32",
        ),
        prompt_len=1536, n_decode=24, chunks=[5, 1, 13, 109, 128, 129, 255, 385], shards=2,
        prompt_tries=10,
    ),
    "tiny-bf16": dict(
        description="bf16 checkpoint (fp32 kept for the _keep_in_fp32_modules_strict tensors), "
        "HF internal names (save_original_format=False); layers [CSA, SWA, HCA, CSA], mlp "
        "[hash, moe, moe, moe], window 16, rates 4/32, top-k 6, o_groups 2. Oracle = the same "
        "bf16 weights upcast to fp32, run in fp32.",
        seed=3003,
        naming="hf-internal",
        dtype="bf16",
        config_style="hf",
        hf=dict(
            vocab_size=256, hidden_size=64, num_hidden_layers=4,
            layer_types=[CSA, SW, HCA, CSA], mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
            num_attention_heads=4, head_dim=32, partial_rotary_factor=0.25, q_lora_rank=48,
            o_groups=2, o_lora_rank=24, n_routed_experts=6, num_experts_per_tok=2,
            moe_intermediate_size=40, sliding_window=16,
            compress_rates={CSA: 4, HCA: 32}, index_n_heads=16, index_head_dim=16, index_topk=6,
            hc_mult=4, hc_sinkhorn_iters=20, routed_scaling_factor=1.5, swiglu_limit=10.0,
            rope_theta=10000.0, compress_rope_theta=160000.0, rope_parameters=dict(YARN),
        ),
        prompt_len=150, n_decode=32, chunks=[5, 1, 13, 31, 4],
    ),
    "tiny-fp8-mxfp4": dict(
        description="The real quantized format: official names, official-style config with "
        "quantization_config (fp8 e4m3, ue8m0, 128x128) and expert_dtype fp4; linear weights FP8 "
        "e4m3 + F8_E8M0 128x128 block scales (hidden 160 -> a full and a partial block); routed "
        "experts MXFP4 (I8 [out, in/2], low nibble = even element, F8_E8M0 scale [out, in/32]); "
        "shared experts FP8; compressor/indexer wkv/wgate/weights_proj and gate BF16; norms/embed/"
        "head BF16; hc_*, attn_sink, ape, gate.bias F32; plus a random mtp.0.* layer (not used by "
        "the oracle). Oracle = the dequantized weights in fp32.",
        seed=4004,
        naming="official",
        dtype="fp8+mxfp4",
        config_style="official",
        quant="fp4-experts",
        official_config=dict(
            vocab_size=128, hidden_size=160, num_hidden_layers=4, compress_ratios=[0, 4, 128, 4, 0],
            num_hash_layers=2, num_attention_heads=4, num_key_value_heads=1, head_dim=64,
            qk_rope_head_dim=16, q_lora_rank=144, o_groups=2, o_lora_rank=136, n_routed_experts=4,
            n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=64, sliding_window=8,
            index_n_heads=16, index_head_dim=32, index_topk=8, hc_mult=4, hc_sinkhorn_iters=20,
            hc_eps=1e-6, rms_norm_eps=1e-6, routed_scaling_factor=2.5, scoring_func="sqrtsoftplus",
            swiglu_limit=10.0, rope_theta=10000, compress_rope_theta=160000, rope_scaling=dict(YARN),
            expert_dtype="fp4", torch_dtype="bfloat16", topk_method="noaux_tc",
            quantization_config={"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                 "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
        ),
        prompt_len=300, n_decode=24, chunks=[5, 1, 13, 108, 2],
    ),
    "tiny-fp8-base": dict(
        description="Base-checkpoint style quantization: official names, FP8 e4m3 128x128 blocks "
        "for every quantized linear INCLUDING routed experts, all block scales stored as F32 "
        "containers holding powers of two (like Flash-Base); every dim <= 128 or a multiple of 128 "
        "so transformers' FineGrainedFP8Config(dequantize=True) loads it (end-to-end HF check); "
        "no expert_dtype key; mtp.0.* present. Oracle = dequantized weights in fp32.",
        seed=5005,
        naming="official",
        dtype="fp8 (f32 scales)",
        config_style="official",
        quant="fp8-experts-f32-scales",
        official_config=dict(
            vocab_size=128, hidden_size=128, num_hidden_layers=3, compress_ratios=[4, 128, 0, 0],
            num_hash_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
            qk_rope_head_dim=16, q_lora_rank=96, o_groups=2, o_lora_rank=64, n_routed_experts=4,
            n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=64, sliding_window=8,
            index_n_heads=16, index_head_dim=32, index_topk=8, hc_mult=4, hc_sinkhorn_iters=20,
            hc_eps=1e-6, rms_norm_eps=1e-6, routed_scaling_factor=1.5, scoring_func="sqrtsoftplus",
            swiglu_limit=10.0, rope_theta=10000, compress_rope_theta=160000, rope_scaling=dict(YARN),
            torch_dtype="bfloat16",
            quantization_config={"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                 "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
        ),
        prompt_len=280, n_decode=24, chunks=[5, 1, 13, 120],
    ),
    "tiny-sigmoid": dict(
        description="Score routing with scoring_func=sigmoid (bias-corrected top-k, normalized, "
        "scaled), no hash layers; layers [HCA, CSA, SWA] window 8, rates 4/8, top-k 3; fp32, "
        "HF default save (mixed names).",
        seed=6006,
        naming="hf-mixed",
        dtype="fp32",
        config_style="hf",
        hf=dict(
            vocab_size=128, hidden_size=64, num_hidden_layers=3,
            layer_types=[HCA, CSA, SW], mlp_layer_types=["moe", "moe", "moe"],
            num_attention_heads=4, head_dim=32, partial_rotary_factor=0.25, q_lora_rank=32,
            o_groups=4, o_lora_rank=16, n_routed_experts=8, num_experts_per_tok=3,
            moe_intermediate_size=32, sliding_window=8, scoring_func="sigmoid",
            compress_rates={CSA: 4, HCA: 8}, index_n_heads=16, index_head_dim=16, index_topk=3,
            hc_mult=4, hc_sinkhorn_iters=20, routed_scaling_factor=2.0, swiglu_limit=10.0,
            rope_theta=10000.0, compress_rope_theta=160000.0, rope_parameters=dict(YARN),
        ),
        prompt_len=120, n_decode=24, chunks=[5, 1, 13, 7],
    ),
}


# --------------------------------------------------------------------------------------
# Model construction and randomisation
# --------------------------------------------------------------------------------------

def make_config(spec: dict, tmpdir: str) -> DeepseekV4Config:
    if spec["config_style"] == "hf":
        cfg = DeepseekV4Config(**spec["hf"])
    else:
        d = official_config_json(spec)
        path = os.path.join(tmpdir, "config.json")
        with open(path, "w") as f:
            json.dump(d, f, indent=2)
        cfg = DeepseekV4Config.from_pretrained(tmpdir)
        if hasattr(cfg, "quantization_config"):
            delattr(cfg, "quantization_config")  # oracle model is plain fp32
    cfg._attn_implementation = "eager"
    return cfg


def official_config_json(spec: dict) -> dict:
    d = {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
         "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 1,
         "hidden_act": "silu", "initializer_range": 0.02, "max_position_embeddings": 1048576,
         "norm_topk_prob": True, "num_nextn_predict_layers": 1, "tie_word_embeddings": False,
         "use_cache": True}
    d.update(spec["official_config"])
    return dict(sorted(d.items()))


@torch.no_grad()
def randomize(model: DeepseekV4ForCausalLM, seed: int, lm_gain: float = 2.0) -> None:
    """Give every parameter/buffer a non-trivial random value with a moderate scale."""
    cfg = model.config
    g = torch.Generator().manual_seed(seed)

    def normal(shape, std, mean=0.0):
        return torch.randn(shape, generator=g, dtype=torch.float32) * std + mean

    named = dict(model.named_parameters())
    named.update({k: v for k, v in model.named_buffers() if not k.endswith("inv_freq")})
    for name in sorted(named):
        p = named[name]
        shp = tuple(p.shape)
        if name.endswith("tid2eid"):
            p.copy_(torch.randint(0, cfg.n_routed_experts, shp, generator=g, dtype=torch.long))
        elif name.endswith("e_score_correction_bias"):
            p.copy_(normal(shp, 0.1))
        elif name.endswith(".sinks"):
            p.copy_(normal(shp, 1.0))
        elif name.endswith("position_bias"):
            p.copy_(normal(shp, 0.5))
        elif name.endswith(("_hc.fn", "hc_head.hc_fn")):
            p.copy_(normal(shp, 1.0 / math.sqrt(shp[1])))
        elif name.endswith(("_hc.base", "hc_head.hc_base")):
            p.copy_(normal(shp, 0.5))
        elif name.endswith(("_hc.scale", "hc_head.hc_scale")):
            p.copy_(torch.rand(shp, generator=g) + 0.5)
        elif name.endswith(("norm.weight", "layernorm.weight")):
            p.copy_(normal(shp, 0.15, 1.0))
        elif name == "model.embed_tokens.weight":
            p.copy_(normal(shp, 1.0))
        elif name == "lm_head.weight":
            p.copy_(normal(shp, lm_gain / math.sqrt(shp[1])))
        elif name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
            p.copy_(normal(shp, 1.0 / math.sqrt(shp[2])))
        elif p.dim() == 2:
            p.copy_(normal(shp, 1.0 / math.sqrt(shp[1])))
        else:
            raise KeyError(f"no randomisation rule for {name} {shp}")


def build_model(cfg: DeepseekV4Config, seed: int) -> DeepseekV4ForCausalLM:
    torch.manual_seed(seed)
    model = DeepseekV4ForCausalLM(cfg).eval().to(torch.float32)
    randomize(model, seed)
    return model


# --------------------------------------------------------------------------------------
# Oracle runs
# --------------------------------------------------------------------------------------

class IndexerProbe:
    """Forward hooks on every indexer scorer: record scores + compress rate for gap stats."""

    def __init__(self, model):
        self.rows = []
        self.handles = []
        for li, layer in enumerate(model.model.layers):
            comp = getattr(layer.self_attn, "compressor", None)
            idx = getattr(comp, "indexer", None) if comp is not None else None
            if idx is None:
                continue
            rate, topk = idx.compress_rate, idx.index_topk
            self.handles.append(idx.scorer.register_forward_hook(
                lambda mod, inp, out, rate=rate, topk=topk, li=li: self.rows.append((out.detach().clone(), rate, topk, li))))

    def close(self):
        for h in self.handles:
            h.remove()

    def stats(self, start_pos: int = 0):
        """Smallest (k-th minus (k+1)-th) indexer score gap over queries with more candidates
        than top-k, relative to the row's max |score|; and count of queries with selection."""
        min_rel, n_sel, n_lt, near = float("inf"), 0, 0, []
        for scores, rate, topk, li in self.rows:
            s = scores[0]  # [S, T]
            S = s.shape[0]
            for i in range(S):
                t = start_pos + i
                n_cand = min((t + 1) // rate, s.shape[1])
                if n_cand <= topk:
                    continue
                row = s[i, :n_cand].double()
                v = torch.sort(row, descending=True).values
                gap = float(v[topk - 1] - v[topk])
                rel = gap / max(float(row.abs().max()), 1e-30)
                n_sel += 1
                if rel < 1e-5:
                    n_lt += 1
                    near.append({"layer": li, "position": t, "rel_gap": rel})
                min_rel = min(min_rel, rel)
        return {"indexer_queries_with_selection": n_sel,
                "indexer_min_rel_topk_gap": (min_rel if n_sel else None),
                "indexer_queries_gap_below_1e-5": n_lt, "indexer_near_ties": near}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@torch.no_grad()
def run_oracle(model, prompt: torch.Tensor, n_decode: int, chunks: list[int]) -> tuple[dict, dict]:
    T = prompt.numel()
    ids = prompt.view(1, T)
    probe = IndexerProbe(model)
    full = model(ids, use_cache=False).logits[0].float()
    idx_stats = probe.stats()
    probe.close()

    # greedy decode through the cache, one token at a time
    out = model(ids, use_cache=True)
    pkv = out.past_key_values
    cached_prefill_last = out.logits[0, -1].float()
    rows = [full[-1]]
    tokens = []
    for i in range(n_decode):
        tok = int(torch.argmax(rows[-1]))
        tokens.append(tok)
        if i == n_decode - 1:
            break
        o = model(torch.tensor([[tok]]), past_key_values=pkv, use_cache=True)
        rows.append(o.logits[0, -1].float())
    decode = torch.stack(rows)
    tokens_t = torch.tensor(tokens, dtype=torch.long)

    # chunked prefill through the cache
    sizes = list(chunks)
    rest = T - sum(sizes)
    assert rest > 0, "chunk sizes exceed prompt"
    sizes.append(rest)
    pkv = None
    parts, pos = [], 0
    for c in sizes:
        o = model(ids[:, pos:pos + c], past_key_values=pkv, use_cache=True)
        pkv = o.past_key_values
        parts.append(o.logits[0].float())
        pos += c
    chunked = torch.cat(parts)

    # cross-check decode rows against one full forward over prompt + tokens[:-1]
    seq = torch.cat([prompt, tokens_t[:-1]]).view(1, -1)
    probe = IndexerProbe(model)
    full_ext = model(seq, use_cache=False).logits[0].float()
    ext_stats = probe.stats()
    probe.close()
    dec_full = full_ext[T - 1:]

    top2 = torch.topk(decode, 2, dim=-1).values
    margins = (top2[:, 0] - top2[:, 1]) / decode.abs().max()
    checks = {
        "max_abs_logit_prefill": float(full.abs().max()),
        "std_logit_prefill": float(full.std()),
        "rel_err_chunked_vs_full": rel_err(chunked, full),
        "rel_err_cached_prefill_last_vs_full": rel_err(cached_prefill_last, full[-1]),
        "rel_err_decode_vs_full_forward_over_prompt_plus_tokens": rel_err(decode, dec_full),
        "greedy_tokens_equal_full_forward_argmax": bool(torch.equal(dec_full.argmax(-1), tokens_t)),
        "min_rel_top1_top2_margin_decode": float(margins.min()),
        "distinct_greedy_tokens": len(set(tokens)),
        **idx_stats,
        "indexer_min_rel_topk_gap_prompt_plus_tokens": ext_stats["indexer_min_rel_topk_gap"],
        "indexer_near_ties_decode_positions": [x for x in ext_stats["indexer_near_ties"] if x["position"] >= T],
    }
    golden = {
        "prompt_ids": prompt.clone(),
        "prefill_logits": full.contiguous(),
        "tokens": tokens_t,
        "decode_logits": decode.contiguous(),
        "chunk_sizes": torch.tensor(sizes, dtype=torch.long),
        "chunked_logits": chunked.contiguous(),
    }
    return golden, checks


# --------------------------------------------------------------------------------------
# Quantisation (official formats)
# --------------------------------------------------------------------------------------

TORCH_TO_ST = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.int64: "I64",
               torch.int8: "I8", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e8m0fnu: "F8_E8M0"}
FP4_LUT = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0.0, -.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float32)


def tbytes(t: torch.Tensor) -> bytes:
    t = t.contiguous()
    return t.view(torch.uint8).numpy().tobytes() if t.dtype != torch.int64 else t.numpy().tobytes()


def entry(t: torch.Tensor):
    return (TORCH_TO_ST[t.dtype], tuple(t.shape), tbytes(t))


def pow2_scale_exponent(amax: torch.Tensor, qmax: float) -> torch.Tensor:
    """Smallest e with amax / 2^e <= qmax (ue8m0 scale = 2^e)."""
    e = torch.ceil(torch.log2(torch.clamp(amax, min=1e-30) / qmax))
    return torch.clamp(e, -127, 127).to(torch.int32)


def quant_fp8_block(w: torch.Tensor, f32_scales: bool):
    """FP8 e4m3 with one ue8m0 scale per 128x128 block (ceil grid; last blocks partial).
    Returns (weight_fp8, scale_tensor, dequantized_fp32)."""
    out_f, in_f = w.shape
    gr, gc = math.ceil(out_f / 128), math.ceil(in_f / 128)
    pad = torch.zeros(gr * 128, gc * 128)
    pad[:out_f, :in_f] = w
    amax = pad.abs().view(gr, 128, gc, 128).amax(dim=(1, 3))
    e = pow2_scale_exponent(amax, 448.0)
    scale = torch.pow(2.0, e.float())  # [gr, gc]
    s_full = scale.repeat_interleave(128, 0).repeat_interleave(128, 1)[:out_f, :in_f]
    q = (w / s_full).to(torch.float8_e4m3fn)
    deq = q.float() * s_full
    if f32_scales:
        st = scale.float()
    else:
        st = (e + 127).to(torch.uint8).view(torch.float8_e8m0fnu)
    return q, st, deq


def quant_mxfp4(w: torch.Tensor):
    """MXFP4: e2m1 values, two per byte (low nibble = even column), ue8m0 scale per 1x32
    block along the input dim. Returns (packed int8 [out, in/2], scale e8m0 [out, in/32], deq)."""
    out_f, in_f = w.shape
    assert in_f % 32 == 0
    blocks = w.view(out_f, in_f // 32, 32)
    amax = blocks.abs().amax(-1)
    e = pow2_scale_exponent(amax, 6.0)
    scale = torch.pow(2.0, e.float())
    v = blocks / scale[..., None]
    mags = FP4_LUT[:8]
    idx = torch.argmin((v.abs()[..., None] - mags).abs(), dim=-1)  # ties -> smaller magnitude
    code = idx + 8 * (v < 0).long()
    deq = (FP4_LUT[code] * scale[..., None]).view(out_f, in_f)
    code = code.view(out_f, in_f)
    packed = (code[:, 0::2] | (code[:, 1::2] << 4)).to(torch.uint8).view(torch.int8)
    st = (e + 127).to(torch.uint8).view(torch.float8_e8m0fnu)
    return packed, st, deq


FP8_SUFFIXES = ("attn.wq_a.weight", "attn.wq_b.weight", "attn.wkv.weight", "attn.wo_a.weight",
                "attn.wo_b.weight", "attn.indexer.wq_b.weight", "shared_experts.w1.weight",
                "shared_experts.w2.weight", "shared_experts.w3.weight", "e_proj.weight", "h_proj.weight")
F32_KEEP = ("hc_attn_fn", "hc_attn_base", "hc_attn_scale", "hc_ffn_fn", "hc_ffn_base", "hc_ffn_scale",
            "hc_head_fn", "hc_head_base", "hc_head_scale", "attn_sink", "ape", "gate.bias")


def quantize_official(off: dict, mode: str) -> tuple[dict, dict, dict]:
    """mode: 'fp4-experts' (instruct style) or 'fp8-experts-f32-scales' (Base style).
    Returns (stored entries for safetensors, dequantized fp32 official dict, dtype counts)."""
    stored, deq, counts = {}, {}, {}
    import re

    for name, t in off.items():
        t = t.detach()
        is_expert = re.search(r"\.ffn\.experts\.\d+\.w[123]\.weight$", name) is not None
        if name.endswith("tid2eid"):
            stored[name] = entry(t.to(torch.int64))
            deq[name] = t
        elif name.endswith(F32_KEEP):
            stored[name] = entry(t.float())
            deq[name] = t.float()
        elif is_expert and mode == "fp4-experts":
            q, s, d = quant_mxfp4(t.float())
            stored[name] = entry(q)
            stored[name[: -len("weight")] + "scale"] = entry(s)
            deq[name] = d
        elif name.endswith(FP8_SUFFIXES) or is_expert:
            q, s, d = quant_fp8_block(t.float(), f32_scales=(mode == "fp8-experts-f32-scales"))
            stored[name] = entry(q)
            stored[name[: -len("weight")] + "scale"] = entry(s)
            deq[name] = d
        else:  # BF16: embed, head, norms, compressor/indexer wkv/wgate, weights_proj, gate.weight
            b = t.to(torch.bfloat16)
            stored[name] = entry(b)
            deq[name] = b.float()
    for dt, _, _ in stored.values():
        counts[dt] = counts.get(dt, 0) + 1
    return stored, deq, counts


def make_mtp(cfg: DeepseekV4Config, seed: int) -> dict:
    """Random official `mtp.0.*` tensors: one SWA-only block with a score-routed MoE, plus
    e_proj/h_proj [D, D], enorm/hnorm/norm [D], hc_head_fn/base/scale (shapes: dsv4-model §9)."""
    d = cfg.to_dict()
    for k in ("layer_types", "mlp_layer_types", "num_hidden_layers", "quantization_config"):
        d.pop(k, None)
    mcfg = DeepseekV4Config(**{**d, "num_hidden_layers": 1, "layer_types": [SW], "mlp_layer_types": ["moe"]})
    m = build_model(mcfg, seed + 77)
    off = hf_to_official(m.state_dict())
    g = torch.Generator().manual_seed(seed + 78)
    D = cfg.hidden_size
    out = {}
    for k, v in off.items():
        if k.startswith("layers.0."):
            out["mtp.0." + k[len("layers.0."):]] = v
        elif k.startswith("hc_head_"):
            out["mtp.0." + k] = v
    out["mtp.0.e_proj.weight"] = torch.randn(D, D, generator=g) / math.sqrt(D)
    out["mtp.0.h_proj.weight"] = torch.randn(D, D, generator=g) / math.sqrt(D)
    for n in ("enorm", "hnorm", "norm"):
        out[f"mtp.0.{n}.weight"] = 1.0 + 0.15 * torch.randn(D, generator=g)
    return out


# --------------------------------------------------------------------------------------
# Writers
# --------------------------------------------------------------------------------------

def write_official(dirpath: str, entries: dict, shards: int) -> list[str]:
    if shards <= 1:
        write_safetensors(os.path.join(dirpath, "model.safetensors"), entries, {"format": "pt"})
        return ["model.safetensors"]
    import re

    def shard_of(name):
        m = re.match(r"^(?:layers|mtp)\.(\d+)\.", name)
        if name.startswith("mtp."):
            return shards - 1
        if m:
            return min(shards - 1, int(m.group(1)) * shards // 4)  # layers split across shards
        return 0 if name.startswith("embed") else shards - 1

    files = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    weight_map, total = {}, 0
    for i, fn in enumerate(files):
        part = {k: v for k, v in entries.items() if shard_of(k) == i}
        write_safetensors(os.path.join(dirpath, fn), part, {"format": "pt"})
        for k, (_, _, b) in part.items():
            weight_map[k] = fn
            total += len(b)
    with open(os.path.join(dirpath, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)
    return files


def save_golden(dirpath: str, golden: dict) -> None:
    write_safetensors(os.path.join(dirpath, "golden.safetensors"), {k: entry(v) for k, v in golden.items()},
                      {"format": "pt"})


def load_logits_from_dir(dirpath: str, prompt: torch.Tensor, **kw) -> torch.Tensor:
    m = DeepseekV4ForCausalLM.from_pretrained(dirpath, dtype=torch.float32, attn_implementation="eager", **kw).eval()
    # with a quantization_config, transformers 5.17.0 leaves the BF16 tensors in bf16 despite
    # dtype=float32 (mixed-dtype matmul then fails); upcast them (exact) for the fp32 check
    m = m.float()
    with torch.no_grad():
        return m(prompt.view(1, -1), use_cache=False).logits[0].float(), m


def max_state_diff(a: dict, b: dict) -> tuple[float, list]:
    worst, missing = 0.0, []
    for k, v in a.items():
        if k.endswith("inv_freq"):
            continue
        if k not in b:
            missing.append(k)
            continue
        worst = max(worst, float((v.double() - b[k].double()).abs().max()) if v.numel() else 0.0)
    return worst, missing


# --------------------------------------------------------------------------------------
# Fixture builders
# --------------------------------------------------------------------------------------

def make_prompt(V: int, T: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, V, (T,), generator=g, dtype=torch.long)


def build_fixture(name: str, spec: dict, outdir: str) -> dict:
    t0 = time.time()
    fdir = os.path.join(outdir, name)
    if os.path.isdir(fdir):
        shutil.rmtree(fdir)
    os.makedirs(fdir)
    tmp = tempfile.mkdtemp(prefix=f"fx-{name}-")
    cfg = make_config(spec, tmp)
    model = build_model(cfg, spec["seed"])
    V = cfg.vocab_size
    notes = {}

    # ---- write the checkpoint and make `model` hold exactly the values the engine will read
    if spec["naming"] == "hf-mixed":
        model.save_pretrained(fdir)
        ckpt_files = ["model.safetensors"]
    elif spec["naming"] == "hf-internal":
        assert spec["dtype"] == "bf16"
        # round-trip through from_pretrained(dtype=bf16) so _keep_in_fp32_modules_strict applies
        model.save_pretrained(tmp + "/fp32")
        mb = DeepseekV4ForCausalLM.from_pretrained(tmp + "/fp32", dtype=torch.bfloat16)
        mb.save_pretrained(fdir, save_original_format=False)
        ckpt_files = ["model.safetensors"]
        model = DeepseekV4ForCausalLM.from_pretrained(fdir, dtype=torch.float32, attn_implementation="eager").eval()
        notes["bf16_roundtrip"] = "oracle = from_pretrained(bf16 dir, dtype=float32)"
    else:  # official names written by us
        off = hf_to_official(model.state_dict())
        quant = spec.get("quant")
        if quant:
            off.update(make_mtp(cfg, spec["seed"]))
            entries, deq, counts = quantize_official(off, quant)
            sd = official_to_hf(deq)
            missing, unexpected = model.load_state_dict(sd, strict=False)
            missing = [k for k in missing if not k.endswith("inv_freq")]
            assert not missing and not unexpected, (missing, unexpected)
            notes["dtype_counts"] = counts
        else:
            entries = {k: entry(v.detach().float() if v.dtype != torch.int64 else v) for k, v in off.items()}
            counts = {}
            for dt, _, _ in entries.values():
                counts[dt] = counts.get(dt, 0) + 1
            notes["dtype_counts"] = counts
        with open(os.path.join(fdir, "config.json"), "w") as f:
            json.dump(official_config_json(spec), f, indent=2)
            f.write("\n")
        ckpt_files = write_official(fdir, entries, spec.get("shards", 1))

    # ---- prompt (optionally pick, among a few seeds, the one with the largest indexer gap)
    T = spec["prompt_len"]
    tries = spec.get("prompt_tries", 1)
    best = None
    for k in range(tries):
        p = make_prompt(V, T, spec["seed"] * 10 + k)
        if tries == 1:
            best = (None, p)
            break
        probe = IndexerProbe(model)
        with torch.no_grad():
            model(p.view(1, -1), use_cache=False)
        g = probe.stats()["indexer_min_rel_topk_gap"] or 0.0
        probe.close()
        print(f"  prompt try {k}: indexer min rel gap {g:.3e}", flush=True)
        if best is None or g > best[0]:
            best = (g, p)
    prompt = best[1]

    golden, checks = run_oracle(model, prompt, spec["n_decode"], spec["chunks"])

    # ---- reload the saved checkpoint with transformers and compare
    reload = {}
    if spec.get("quant"):
        from transformers import FineGrainedFP8Config

        try:
            lg, m2 = load_logits_from_dir(fdir, prompt, quantization_config=FineGrainedFP8Config(dequantize=True))
            sdiff, miss = max_state_diff(model.state_dict(), {k: v.float() for k, v in m2.state_dict().items()})
            reload = {"hf_fp8_dequantize_reload": "ok",
                      "hf_reload_rel_err_prefill": rel_err(lg, golden["prefill_logits"]),
                      "hf_reload_max_abs_weight_diff": sdiff,
                      "hf_reload_param_dtypes": sorted({str(v.dtype) for v in m2.state_dict().values()})}
        except Exception as e:  # noqa: BLE001
            reload = {"hf_fp8_dequantize_reload": f"failed: {type(e).__name__}: {str(e)[:300]}"}
        # own dequantisation from the files on disk, loaded with HF names (exact oracle check)
        reload.update(verify_official_quant_files(fdir, model, prompt, golden))
    else:
        lg, m2 = load_logits_from_dir(fdir, prompt)
        sdiff, miss = max_state_diff(model.state_dict(), m2.state_dict())
        reload = {"hf_reload_rel_err_prefill": rel_err(lg, golden["prefill_logits"]),
                  "hf_reload_bit_identical_prefill": bool(torch.equal(lg, golden["prefill_logits"])),
                  "hf_reload_max_abs_weight_diff": sdiff, "hf_reload_missing": miss}
    save_golden(fdir, golden)

    size = sum(os.path.getsize(os.path.join(fdir, f)) for f in os.listdir(fdir))
    meta = {
        "name": name,
        "description": spec["description"],
        "naming_scheme": spec["naming"],
        "checkpoint_dtype": spec["dtype"],
        "checkpoint_files": ckpt_files,
        "config_style": spec["config_style"],
        "oracle": {
            "implementation": "transformers DeepseekV4ForCausalLM, eager attention, float32, CPU",
            "transformers_version": transformers.__version__,
            "torch_version": torch.__version__,
            "weights": {"fp32": "as stored", "bf16": "bf16 values upcast to fp32",
                        "official": "as stored (fp32)"}.get(spec["dtype"], "dequantized per docs/checkpoint-format.md, fp32"),
            "rope_parameters": cfg.rope_parameters if spec["naming"] != "hf-internal" else model.config.rope_parameters,
            "layer_types": list(model.config.layer_types),
            "mlp_layer_types": list(model.config.mlp_layer_types),
            "compress_rates": dict(model.config.compress_rates),
        },
        "seed": spec["seed"],
        "prompt_len": T,
        "n_decode": spec["n_decode"],
        "chunk_sizes": golden["chunk_sizes"].tolist(),
        "vocab_size": V,
        "checks": checks,
        "reload": reload,
        "notes": notes,
        "fixture_bytes": size,
        "generator": "tools/make_fixtures.py",
        "build_seconds": round(time.time() - t0, 1),
    }
    with open(os.path.join(fdir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2, default=str)
        f.write("\n")
    shutil.rmtree(tmp, ignore_errors=True)
    return meta


def verify_official_quant_files(fdir: str, model, prompt, golden) -> dict:
    """Re-read the files we wrote, dequantize with the documented formulas, map names with
    official_to_hf and check the oracle model holds exactly those values."""
    from safetensors import safe_open

    files = [f for f in os.listdir(fdir) if f.startswith("model") and f.endswith(".safetensors")]
    raw = {}
    for fn in files:
        with safe_open(os.path.join(fdir, fn), "pt") as f:
            for k in f.keys():
                raw[k] = f.get_tensor(k)
    deq = {}
    for k, t in raw.items():
        if k.endswith(".scale"):
            continue
        sk = k[: -len("weight")] + "scale"
        if sk in raw:
            s = raw[sk].float()
            if t.dtype == torch.int8:
                u = t.view(torch.uint8).long()
                vals = torch.stack([FP4_LUT[u & 15], FP4_LUT[u >> 4]], -1).view(t.shape[0], -1)
                deq[k] = vals * s.repeat_interleave(32, 1)
            else:
                sf = s.repeat_interleave(128, 0).repeat_interleave(128, 1)[: t.shape[0], : t.shape[1]]
                deq[k] = t.float() * sf
        else:
            deq[k] = t if t.dtype == torch.int64 else t.float()
    # cross-check every (weight, scale) pair with transformers' own Fp8Dequantize op where its
    # block-size inference (rows/scale_rows, cols/scale_cols) gives the true block size
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    op = Fp8Dequantize(None)
    hf_ok, hf_bad_block, hf_err = 0, [], 0.0
    for k, t in raw.items():
        sk = k[: -len("weight")] + "scale"
        if k.endswith(".scale") or sk not in raw:
            continue
        s = raw[sk]
        cols = t.shape[1] * (2 if t.dtype == torch.int8 else 1)
        blk = (1, 32) if t.dtype == torch.int8 else (128, 128)
        inferred = (t.shape[0] / s.shape[0], cols / s.shape[1])
        if inferred != (float(min(blk[0], t.shape[0])) if s.shape[0] == 1 else float(blk[0]),
                        float(min(blk[1], cols)) if s.shape[1] == 1 else float(blk[1])):
            hf_bad_block.append(f"{k} {list(t.shape)} scale {list(s.shape)}")
            continue
        d = op._dequantize_one(t, s, output_dtype=torch.float32)
        hf_err = max(hf_err, float((d - deq[k]).abs().max()))
        hf_ok += 1
    sd = official_to_hf(deq)
    ref = model.state_dict()
    worst = max(float((sd[k].double() - ref[k].double()).abs().max()) for k in sd)
    missing = [k for k in ref if k not in sd and not k.endswith("inv_freq")]
    return {"hf_Fp8Dequantize_op_checked_tensors": hf_ok, "hf_Fp8Dequantize_op_max_abs_diff": hf_err,
            "hf_wrong_block_inference_tensors (partial 128-blocks; HF would mis-dequantize or raise)": len(hf_bad_block),
            "own_dequant_vs_oracle_weights_max_abs": worst, "own_dequant_missing": missing,
            "tensors_in_files": len(raw), "mtp_tensors": sum(k.startswith("mtp.") for k in raw)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/fixtures")
    ap.add_argument("--only", nargs="*", help="fixture names (default: all)")
    args = ap.parse_args()
    names = args.only or list(FIXTURES)
    os.makedirs(args.out, exist_ok=True)
    for n in names:
        print(f"== {n}", flush=True)
        meta = build_fixture(n, FIXTURES[n], args.out)
        print(json.dumps({"checks": meta["checks"], "reload": meta["reload"], "bytes": meta["fixture_bytes"],
                          "seconds": meta["build_seconds"]}, indent=1, default=str), flush=True)


if __name__ == "__main__":
    main()
