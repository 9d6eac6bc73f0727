"""Tensor-name conversion between transformers' internal DeepSeek-V4 names and DeepSeek's
official checkpoint names (docs/checkpoint-format.md).

`hf_to_official(state_dict)` takes `DeepseekV4ForCausalLM.state_dict()` (internal names,
fused experts) and returns an ordered dict of official names -> tensors (per-expert w1/w2/w3).
It is the inverse of transformers 5.17.0's `conversion_mapping.py` rules for `deepseek_v4`;
make_fixtures.py checks that transformers loads the result back to the identical state dict.
"""

from __future__ import annotations

import re

# (regex on the internal name after the `model.layers.N.` prefix was split off, replacement)
_LAYER_RULES = [
    (r"^input_layernorm\.weight$", "attn_norm.weight"),
    (r"^post_attention_layernorm\.weight$", "ffn_norm.weight"),
    (r"^attn_hc\.(fn|base|scale)$", r"hc_attn_\1"),
    (r"^ffn_hc\.(fn|base|scale)$", r"hc_ffn_\1"),
    (r"^self_attn\.q_a_proj\.weight$", "attn.wq_a.weight"),
    (r"^self_attn\.q_a_norm\.weight$", "attn.q_norm.weight"),
    (r"^self_attn\.q_b_proj\.weight$", "attn.wq_b.weight"),
    (r"^self_attn\.kv_proj\.weight$", "attn.wkv.weight"),
    (r"^self_attn\.kv_norm\.weight$", "attn.kv_norm.weight"),
    (r"^self_attn\.o_a_proj\.weight$", "attn.wo_a.weight"),
    (r"^self_attn\.o_b_proj\.weight$", "attn.wo_b.weight"),
    (r"^self_attn\.sinks$", "attn.attn_sink"),
    (r"^self_attn\.compressor\.kv_proj\.weight$", "attn.compressor.wkv.weight"),
    (r"^self_attn\.compressor\.gate_proj\.weight$", "attn.compressor.wgate.weight"),
    (r"^self_attn\.compressor\.position_bias$", "attn.compressor.ape"),
    (r"^self_attn\.compressor\.kv_norm\.weight$", "attn.compressor.norm.weight"),
    (r"^self_attn\.compressor\.indexer\.kv_proj\.weight$", "attn.indexer.compressor.wkv.weight"),
    (r"^self_attn\.compressor\.indexer\.gate_proj\.weight$", "attn.indexer.compressor.wgate.weight"),
    (r"^self_attn\.compressor\.indexer\.position_bias$", "attn.indexer.compressor.ape"),
    (r"^self_attn\.compressor\.indexer\.kv_norm\.weight$", "attn.indexer.compressor.norm.weight"),
    (r"^self_attn\.compressor\.indexer\.q_b_proj\.weight$", "attn.indexer.wq_b.weight"),
    (r"^self_attn\.compressor\.indexer\.scorer\.weights_proj\.weight$", "attn.indexer.weights_proj.weight"),
    (r"^mlp\.gate\.weight$", "ffn.gate.weight"),
    (r"^mlp\.gate\.e_score_correction_bias$", "ffn.gate.bias"),
    (r"^mlp\.gate\.tid2eid$", "ffn.gate.tid2eid"),
    (r"^mlp\.shared_experts\.gate_proj\.weight$", "ffn.shared_experts.w1.weight"),
    (r"^mlp\.shared_experts\.up_proj\.weight$", "ffn.shared_experts.w3.weight"),
    (r"^mlp\.shared_experts\.down_proj\.weight$", "ffn.shared_experts.w2.weight"),
]

_TOP = {
    "model.embed_tokens.weight": "embed.weight",
    "lm_head.weight": "head.weight",
    "model.norm.weight": "norm.weight",
    "model.hc_head.hc_fn": "hc_head_fn",
    "model.hc_head.hc_base": "hc_head_base",
    "model.hc_head.hc_scale": "hc_head_scale",
}


def hf_to_official(sd: dict) -> dict:
    out = {}
    for name, t in sd.items():
        if name in _TOP:
            out[_TOP[name]] = t
            continue
        m = re.match(r"^model\.layers\.(\d+)\.(.*)$", name)
        if not m:
            if name.endswith("inv_freq"):
                continue  # rotary buffers are not in checkpoints
            raise KeyError(f"unmapped tensor {name}")
        layer, rest = m.group(1), m.group(2)
        if rest.endswith("inv_freq"):
            continue
        if rest == "mlp.experts.gate_up_proj":
            E, two_i, _ = t.shape
            inter = two_i // 2
            for e in range(E):
                out[f"layers.{layer}.ffn.experts.{e}.w1.weight"] = t[e, :inter].contiguous()
                out[f"layers.{layer}.ffn.experts.{e}.w3.weight"] = t[e, inter:].contiguous()
            continue
        if rest == "mlp.experts.down_proj":
            for e in range(t.shape[0]):
                out[f"layers.{layer}.ffn.experts.{e}.w2.weight"] = t[e].contiguous()
            continue
        for pat, rep in _LAYER_RULES:
            if re.match(pat, rest):
                out[f"layers.{layer}." + re.sub(pat, rep, rest)] = t
                break
        else:
            raise KeyError(f"unmapped tensor {name}")
    return out


def official_to_hf(off: dict) -> dict:
    """Inverse of hf_to_official (official names -> internal names, experts fused).
    `mtp.*` tensors are skipped (transformers does not build the MTP layer)."""
    top_rev = {v: k for k, v in _TOP.items()}
    out = {}
    experts: dict = {}
    for name, t in off.items():
        if name.startswith("mtp."):
            continue
        if name in top_rev:
            out[top_rev[name]] = t
            continue
        m = re.match(r"^layers\.(\d+)\.ffn\.experts\.(\d+)\.(w[123])\.weight$", name)
        if m:
            experts.setdefault(int(m.group(1)), {})[(int(m.group(2)), m.group(3))] = t
            continue
        m = re.match(r"^layers\.(\d+)\.(.*)$", name)
        if not m:
            raise KeyError(f"unmapped official tensor {name}")
        layer, rest = m.group(1), m.group(2)
        for pat, rep in _LAYER_RULES:
            # rules are written internal->official; invert literal ones
            internal = pat.strip("^$").replace("\\.", ".")
            if "(" in internal:  # hc_* rules
                mm = re.match(r"^hc_(attn|ffn)_(fn|base|scale)$", rest)
                if mm:
                    out[f"model.layers.{layer}.{mm.group(1)}_hc.{mm.group(2)}"] = t
                    break
                continue
            if rep == rest:
                out[f"model.layers.{layer}.{internal}"] = t
                break
        else:
            raise KeyError(f"unmapped official tensor {name}")
    import torch

    for layer, d in experts.items():
        E = 1 + max(e for e, _ in d)
        gate_up = torch.stack([torch.cat([d[(e, "w1")], d[(e, "w3")]], 0) for e in range(E)])
        down = torch.stack([d[(e, "w2")] for e in range(E)])
        out[f"model.layers.{layer}.mlp.experts.gate_up_proj"] = gate_up
        out[f"model.layers.{layer}.mlp.experts.down_proj"] = down
    return out
