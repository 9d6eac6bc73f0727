#!/usr/bin/env python3
"""Train v4serve's embedded default model: a tiny DeepSeek-V4 (transformers 5.17.0,
DeepseekV4ForCausalLM, eager attention) on English prose from the Python documentation.

Runs on one GPU (bf16 autocast, fp32 master weights, AdamW) for a fixed wall-clock budget and
saves the checkpoint in fp32 with save_pretrained:
  OUT/{config.json, model.safetensors, generation_config.json}
The tokenizer files are copied from --tokenizer-dir into OUT.

Usage (device):  python3 tools/train_embedded.py --data DIR --tokenizer-dir models/default \
                    --out OUT --minutes 5
CPU smoke test:  python3 tools/train_embedded.py ... --device cpu --minutes 0.3 --batch 2 --seq-len 128
"""
import argparse
import json
import math
import os
import random
import shutil
import time

import torch
from tokenizers import Tokenizer
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM, GenerationConfig

BOS, EOS = 0, 1
USER, ASSISTANT, END_THINK = "<｜User｜>", "<｜Assistant｜>", "</think>"


def model_config(vocab_size):
    layer_types = [
        "sliding_attention",
        "compressed_sparse_attention",
        "heavily_compressed_attention",
        "compressed_sparse_attention",
        "heavily_compressed_attention",
        "compressed_sparse_attention",
    ]
    return DeepseekV4Config(
        vocab_size=vocab_size,
        hidden_size=192,
        num_hidden_layers=len(layer_types),
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=64,
        partial_rotary_factor=0.25,          # 16 rope dims (trailing) of 64
        q_lora_rank=96,
        o_groups=2,
        o_lora_rank=96,
        sliding_window=32,
        layer_types=layer_types,
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
        rope_theta=10000.0,
        compress_rope_theta=160000.0,
        rope_parameters={"rope_type": "yarn", "factor": 16.0,
                         "original_max_position_embeddings": 65536,
                         "beta_fast": 32.0, "beta_slow": 1.0},
        max_position_embeddings=1048576,
        index_n_heads=8,
        index_head_dim=32,
        index_topk=16,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_shared_experts=1,
        moe_intermediate_size=128,
        mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe", "moe", "moe"],
        scoring_func="sqrtsoftplus",
        routed_scaling_factor=1.5,
        swiglu_limit=10.0,
        hc_mult=4,
        hc_sinkhorn_iters=20,
        hc_eps=1e-6,
        rms_norm_eps=1e-6,
        num_nextn_predict_layers=0,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=None,
        tie_word_embeddings=False,
        initializer_range=0.02,
        attn_implementation="eager",
    )


def build_stream(tok, path, chat_frac, rng):
    """Documents as BOS + text + EOS; a fraction of paragraphs also as one-turn chats
    (user = first sentence, assistant = rest of the paragraph), chat mode (`</think>`)."""
    docs = open(path, encoding="utf-8").read().split("\n\n")
    pieces, chats = [], []
    for d in docs:
        d = d.strip()
        if not d:
            continue
        pieces.append(d)
        for p in d.split("\n"):
            k = p.find(". ")
            if k > 20 and len(p) - k > 60 and rng.random() < chat_frac:
                q, a = p[: k + 1], p[k + 2:]
                chats.append(f"{USER}{q}{ASSISTANT}{END_THINK}{a}")
    enc = tok.encode_batch(pieces, add_special_tokens=False)
    enc_c = tok.encode_batch(chats, add_special_tokens=False) if chats else []
    units = [[BOS] + e.ids + [EOS] for e in enc] + [[BOS] + e.ids + [EOS] for e in enc_c]
    rng.shuffle(units)
    stream = [t for u in units for t in u]
    return torch.tensor(stream, dtype=torch.long), len(pieces), len(chats)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="dir with train.txt and heldout.txt")
    ap.add_argument("--tokenizer-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.05)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--chat-frac", type=float, default=0.15)
    ap.add_argument("--bias-update", type=float, default=1e-3, help="aux-loss-free balancing step")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--log", default=None)
    a = ap.parse_args()

    torch.manual_seed(a.seed)
    rng = random.Random(a.seed)
    dev = torch.device(a.device)
    tok = Tokenizer.from_file(os.path.join(a.tokenizer_dir, "tokenizer.json"))
    V = tok.get_vocab_size()
    train, ndocs, nchats = build_stream(tok, os.path.join(a.data, "train.txt"), a.chat_frac, rng)
    held, _, _ = build_stream(tok, os.path.join(a.data, "heldout.txt"), 0.0, random.Random(0))
    print(f"train tokens {len(train)} ({ndocs} docs, {nchats} chats), heldout tokens {len(held)}", flush=True)

    cfg = model_config(V)
    model = DeepseekV4ForCausalLM(cfg)
    # transformers zero-inits tid2eid: give the hash layers a fixed random token->experts table
    # (top-k distinct experts per token id).
    g = torch.Generator().manual_seed(a.seed + 1)
    for layer in model.model.layers:
        gate = layer.mlp.gate
        if hasattr(gate, "tid2eid"):
            tbl = torch.stack([torch.randperm(cfg.n_routed_experts, generator=g)[: cfg.num_experts_per_tok]
                               for _ in range(V)])
            gate.tid2eid.copy_(tbl)
    model.to(dev)
    nparams = sum(p.numel() for p in model.parameters())
    print("params", nparams, "config rope", json.dumps(model.config.rope_parameters), flush=True)

    # aux-loss-free load balancing of score-routed layers: count expert hits per step,
    # nudge e_score_correction_bias towards uniform load (DeepSeek-V3 style).
    counts = {}

    def hook(mod, inp, out):
        idx = out[2].detach()
        c = torch.bincount(idx.reshape(-1), minlength=mod.num_experts).float()
        counts[mod] = counts.get(mod, 0) + c
    routers = [l.mlp.gate for l in model.model.layers if not hasattr(l.mlp.gate, "tid2eid")]
    for r in routers:
        r.register_forward_hook(hook)

    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (decay if p.ndim >= 2 and "embed" not in n else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=(dev.type == "cuda"))

    T, B = a.seq_len, a.batch
    budget = a.minutes * 60.0
    amp = dev.type == "cuda"

    def batch_from(stream, gen_rng):
        starts = [gen_rng.randrange(0, len(stream) - T - 1) for _ in range(B)]
        x = torch.stack([stream[s: s + T] for s in starts])
        return x.to(dev, non_blocking=True)

    @torch.no_grad()
    def heldout_loss(n=8):
        model.eval()
        tot, cnt = 0.0, 0
        for i in range(n):
            s = (i * (len(held) - T - 1)) // max(n - 1, 1)
            x = held[s: s + T].unsqueeze(0).to(dev)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
                out = model(input_ids=x, labels=x, use_cache=False)
            tot += out.loss.float().item(); cnt += 1
        model.train()
        return tot / cnt

    log = []
    t0 = time.time()
    step = 0
    brng = random.Random(a.seed + 2)
    model.train()
    while True:
        el = time.time() - t0
        if el >= budget:
            break
        frac = el / budget
        lr = a.lr * min(1.0, (step + 1) / a.warmup) * (a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * frac)))
        for gr in opt.param_groups:
            gr["lr"] = lr
        x = batch_from(train, brng)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
            out = model(input_ids=x, labels=x, use_cache=False)
        loss = out.loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            for r in routers:
                c = counts.pop(r, None)
                if c is not None:
                    r.e_score_correction_bias.add_(a.bias_update * torch.sign(c.mean() - c))
        step += 1
        if step % 50 == 0 or step == 1:
            rec = {"step": step, "time_s": round(time.time() - t0, 1), "lr": lr,
                   "loss": round(loss.item(), 4), "grad_norm": round(float(gn), 3)}
            if step % 250 == 0:
                rec["heldout_loss"] = round(heldout_loss(), 4)
            log.append(rec)
            print(json.dumps(rec), flush=True)
    final = {"step": step, "time_s": round(time.time() - t0, 1), "loss": round(loss.item(), 4),
             "heldout_loss": round(heldout_loss(16), 4), "tokens_seen": step * B * T}
    log.append(final)
    print("final", json.dumps(final), flush=True)

    model.eval()
    model.float()
    os.makedirs(a.out, exist_ok=True)
    model.generation_config = GenerationConfig(bos_token_id=BOS, eos_token_id=EOS, do_sample=False)
    model.save_pretrained(a.out)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        if os.path.abspath(os.path.join(a.tokenizer_dir, f)) != os.path.abspath(os.path.join(a.out, f)):
            shutil.copy(os.path.join(a.tokenizer_dir, f), os.path.join(a.out, f))
    if a.log:
        with open(a.log, "w") as fh:
            json.dump({"args": vars(a), "params": nparams, "train_tokens": len(train), "log": log}, fh, indent=1)

    # quick look at greedy continuations
    for p in ["The Python interpreter", "A list is", "This module provides",
              f"{USER}What is a dictionary?{ASSISTANT}{END_THINK}"]:
        ids = [BOS] + tok.encode(p, add_special_tokens=False).ids
        x = torch.tensor([ids], device=dev)
        with torch.no_grad():
            y = model.generate(x, max_new_tokens=40, do_sample=False)
        print(repr(p), "->", repr(tok.decode(y[0, len(ids):].tolist(), skip_special_tokens=False)), flush=True)


if __name__ == "__main__":
    main()
