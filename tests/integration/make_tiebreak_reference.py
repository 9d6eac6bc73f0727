#!/usr/bin/env python3
"""Per-token held-out NLL of the embedded model from transformers with a *defined* tie order in
top-k (equal scores: the lower index first), for tests/integration/test_embedded_model.cpp.

Why: the lightning indexer's scores are sums of ReLUs, so several compressed rows often score
exactly 0.0 and the top-k boundary falls inside a tie (docs: dsv4-model.md pitfall P19). Which
tied rows `torch.topk` returns is unspecified (it differs between CPU and CUDA); v4serve's CPU op
takes the lower row index first. tests/data/model/heldout_ppl.json is plain transformers (torch's
own tie order); this file is the same forward with only the tie order pinned, so that every
position can be compared, not only the mean. It also lists the positions where the reference
indexer's top-k boundary is an exact tie.

Run (CPU, ~1 min): python3 tests/integration/make_tiebreak_reference.py
Needs torch and transformers 5.17.0 (tools/requirements-test.txt).
"""
import json
import os

import torch
import transformers
from transformers import AutoModelForCausalLM

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "tests", "integration", "data", "heldout_nll_lowest_index_ties.json")


def stable_topk(self, k, dim=-1, largest=True, sorted=True):
    # Sort with a stable algorithm: equal values keep ascending index order.
    vals, idx = torch.sort(self, dim=dim, descending=largest, stable=True)
    return torch.return_types.topk((vals.narrow(dim, 0, k), idx.narrow(dim, 0, k)))


def main():
    torch.manual_seed(0)
    model_dir = os.path.join(ROOT, "models", "default")
    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                             attn_implementation="eager").eval()
    ids = json.load(open(os.path.join(ROOT, "tests", "data", "model", "heldout_ids.json")))["input_ids"]
    k = m.config.index_topk
    rate = m.config.compress_rates["compressed_sparse_attention"]
    ties = {}

    def hook_for(layer):
        def hook(mod, inp, out):
            s = out[0]  # [S, T] indexer scores of every query
            S, T = s.shape
            thr = (torch.arange(S) + 1) // rate  # rows a query may see
            s = s.masked_fill(torch.arange(T).view(1, -1) >= thr.view(-1, 1), float("-inf"))
            if T > k:
                v = s.topk(k + 1, dim=-1).values
                tie = (thr > k) & (v[:, k - 1] == v[:, k])
                ties[layer] = tie.nonzero().flatten().tolist()
        return hook

    for li, layer in enumerate(m.model.layers):
        for name, mod in layer.named_modules():
            if name.endswith("indexer.scorer"):
                mod.register_forward_hook(hook_for(li))

    x = torch.tensor([ids])
    plain_topk = torch.Tensor.topk
    with torch.no_grad():
        ref_logits = m(x).logits[0].double()
        torch.Tensor.topk = stable_topk
        try:
            logits = m(x).logits[0].double()
        finally:
            torch.Tensor.topk = plain_topk
    tgt = torch.tensor(ids[1:])
    rows = torch.arange(len(ids) - 1)
    nll = -torch.log_softmax(logits, -1)[rows, tgt]
    nll_plain = -torch.log_softmax(ref_logits, -1)[rows, tgt]
    out = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "dtype": "float32",
        "attn_implementation": "eager",
        "input": "tests/data/model/heldout_ids.json input_ids; NLL of input_ids[1:], one full forward",
        "tie_order": "top-k (indexer and router) with equal scores: lower index first (stable sort)",
        "n_tokens": len(ids) - 1,
        "mean_nll": nll.mean().item(),
        "mean_nll_torch_tie_order": nll_plain.mean().item(),
        "indexer_exact_tie_positions_pinned_order_forward": {str(l): p for l, p in sorted(ties.items())},
        "max_abs_diff_vs_torch_tie_order": (nll - nll_plain).abs().max().item(),
        "token_nll": [round(v, 6) for v in nll.tolist()],
    }
    with open(OUT, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"wrote {OUT}: mean NLL {out['mean_nll']:.6f} (torch tie order {out['mean_nll_torch_tie_order']:.6f}), "
          f"max |dNLL| between tie orders {out['max_abs_diff_vs_torch_tie_order']:.4f}, ties {out['indexer_exact_tie_positions_pinned_order_forward']}")


if __name__ == "__main__":
    main()
