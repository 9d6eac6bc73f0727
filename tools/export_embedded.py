#!/usr/bin/env python3
"""Check the embedded default model and write the reference data for v4serve's tests.

Runs on CPU in float32 with transformers (the oracle) and writes into --out-dir
(tests/data/model/):
  heldout.txt        held-out English text (whole paragraphs, <= --max-tokens tokens)
  heldout_ids.json   {"text_ids": tokenizer ids of heldout.txt, "input_ids": [BOS] + text_ids, ...}
  heldout_ppl.json   perplexity of the model over input_ids (one full-sequence forward pass,
                     eager attention, float32): ppl, mean_nll, n_tokens, token_nll
  generations.json   greedy continuations (transformers generate, KV cache, do_sample=False,
                     32 new tokens max, stops at EOS) for a few prompts

Usage:
  python3 tools/export_embedded.py --model models/default --heldout-src /tmp/corpus/out/heldout.txt \
      --out-dir tests/data/model
"""
import argparse
import json
import math
import os

import torch
import transformers
from tokenizers import Tokenizer
from transformers import DeepseekV4ForCausalLM

BOS, EOS = 0, 1
PROMPTS = [
    "The Python interpreter",
    "A list is",
    "This module provides",
    "The following example shows how to",
    "<｜User｜>What is a dictionary?<｜Assistant｜></think>",
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/default")
    ap.add_argument("--heldout-src", required=True)
    ap.add_argument("--out-dir", default="tests/data/model")
    ap.add_argument("--max-tokens", type=int, default=2000)
    ap.add_argument("--new-tokens", type=int, default=32)
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(max(1, os.cpu_count() or 1))

    tok = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
    model = DeepseekV4ForCausalLM.from_pretrained(a.model, dtype=torch.float32, attn_implementation="eager")
    model.eval()

    # sanity: parameters that transformers zero-inits must be trained / set
    sd = model.state_dict()
    # (the lightning indexer gets no gradient through its top-k in transformers, so its
    # parameters keep their random init and its position_bias stays zero)
    for key in sd:
        if key.endswith(("tid2eid", "e_score_correction_bias", "sinks", "base", "position_bias")):
            t = sd[key]
            if "indexer" in key:
                continue
            assert t.abs().sum() > 0, f"{key} is all zeros"
    tid = [k for k in sd if k.endswith("tid2eid")]
    print("tid2eid tensors", tid, sd[tid[0]].dtype, sd[tid[0]].shape)

    # held-out text: whole paragraphs of the first held-out documents, <= max_tokens tokens
    paras = [p for p in open(a.heldout_src, encoding="utf-8").read().split("\n") if p.strip()]
    chosen, n = [], 0
    for p in paras:
        k = len(tok.encode(p + "\n", add_special_tokens=False).ids)
        if n + k > a.max_tokens - 1:
            break
        chosen.append(p); n += k
    text = "\n".join(chosen) + "\n"
    text_ids = tok.encode(text, add_special_tokens=False).ids
    assert len(text_ids) + 1 <= a.max_tokens and tok.decode(text_ids, skip_special_tokens=False) == text
    input_ids = [BOS] + text_ids
    os.makedirs(a.out_dir, exist_ok=True)
    with open(os.path.join(a.out_dir, "heldout.txt"), "w", encoding="utf-8") as fh:
        fh.write(text)
    with open(os.path.join(a.out_dir, "heldout_ids.json"), "w") as fh:
        json.dump({"text_file": "heldout.txt", "tokenizer": "models/default/tokenizer.json",
                   "add_special_tokens": False, "bos_prepended": True,
                   "text_ids": text_ids, "input_ids": input_ids}, fh)
        fh.write("\n")

    with torch.no_grad():
        x = torch.tensor([input_ids])
        logits = model(input_ids=x, use_cache=False).logits[0].double()
        logp = torch.log_softmax(logits[:-1], dim=-1)
        nll = -logp.gather(1, x[0, 1:, None]).squeeze(1)
    mean_nll = nll.mean().item()
    res = {"ppl": math.exp(mean_nll), "mean_nll": mean_nll, "n_tokens": int(nll.numel()),
           "input": "heldout_ids.json input_ids (BOS + text_ids); NLL of input_ids[1:] given prefixes, "
                    "one full-sequence forward pass",
           "transformers": transformers.__version__, "torch": torch.__version__,
           "dtype": "float32", "attn_implementation": "eager",
           "token_nll": [round(v, 6) for v in nll.tolist()]}
    with open(os.path.join(a.out_dir, "heldout_ppl.json"), "w") as fh:
        json.dump(res, fh)
        fh.write("\n")
    print("heldout: n_tokens", res["n_tokens"], "mean_nll", mean_nll, "ppl", res["ppl"], flush=True)

    gens = []
    for p in PROMPTS:
        ids = [BOS] + tok.encode(p, add_special_tokens=False).ids
        with torch.no_grad():
            y = model.generate(torch.tensor([ids]), max_new_tokens=a.new_tokens, do_sample=False,
                               eos_token_id=EOS, pad_token_id=EOS)
            cont = y[0, len(ids):].tolist()
            # consistency: a full-sequence forward (no cache) gives the same argmax, record margins
            full = model(input_ids=y[:, :len(ids) + len(cont)], use_cache=False).logits[0]
            steps = full[len(ids) - 1: len(ids) - 1 + len(cont)]
            top2 = steps.topk(2, dim=-1)
            argmax_ok = top2.indices[:, 0].tolist() == cont
            margin = (top2.values[:, 0] - top2.values[:, 1]).min().item()
        g = {"prompt": p, "ids": ids, "continuation_ids": cont,
             "continuation_text": tok.decode(cont, skip_special_tokens=False),
             "stopped_at_eos": bool(cont and cont[-1] == EOS),
             "full_forward_argmax_agrees": argmax_ok, "min_top1_top2_logit_margin": round(margin, 6)}
        gens.append(g)
        print(json.dumps({k: g[k] for k in ("prompt", "continuation_text", "full_forward_argmax_agrees",
                                              "min_top1_top2_logit_margin")}, ensure_ascii=False), flush=True)
    with open(os.path.join(a.out_dir, "generations.json"), "w", encoding="utf-8") as fh:
        json.dump({"transformers": transformers.__version__, "dtype": "float32", "do_sample": False,
                   "max_new_tokens": a.new_tokens, "bos_prepended": True,
                   "note": "ids = [BOS] + tokenizer(prompt, add_special_tokens=False); greedy via "
                           "generate() with KV cache, stops after EOS",
                   "generations": gens}, fh, ensure_ascii=False, indent=1)
        fh.write("\n")


if __name__ == "__main__":
    main()
