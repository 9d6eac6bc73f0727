#!/usr/bin/env python3
"""Train the embedded default model's byte-level BPE tokenizer with HF `tokenizers`.

The normalizer, pre-tokenizer, post-processor and decoder sections are taken verbatim from
DeepSeek-V3's tokenizer.json (DeepSeek-V4 uses the same ones); only the vocabulary and merges
are new.  The added-token table carries DeepSeek-V4's named special tokens (ids differ from the
real model's, except bos=0, eos=1, pad=2) with the same `special`/`normalized` flags as the
DeepSeek release.

Usage:
  python3 tools/train_tokenizer.py --corpus /tmp/corpus/out/train.txt \
      --reference ../shared/data/tokenizers/deepseek-v3/tokenizer.json \
      --vocab-size 6144 --out models/default
"""
import argparse
import json
import os

from tokenizers import Tokenizer, pre_tokenizers, trainers

# DeepSeek-V4 named added tokens (chat-encoding.md §1), in the order of the real table.
# (content, special) — special=True only for BOS/EOS/pad and <|EOT|>, as in DeepSeek's release.
V4_ADDED = [
    ("<｜begin▁of▁sentence｜>", True),
    ("<｜end▁of▁sentence｜>", True),
    ("<｜▁pad▁｜>", True),
    ("<｜fim▁hole｜>", False),
    ("<｜fim▁begin｜>", False),
    ("<｜fim▁end｜>", False),
    ("<｜User｜>", False),
    ("<｜Assistant｜>", False),
    ("<|EOT|>", True),
    ("<｜tool▁calls▁begin｜>", False),
    ("<｜tool▁calls▁end｜>", False),
    ("<｜tool▁call▁begin｜>", False),
    ("<｜tool▁call▁end｜>", False),
    ("<｜tool▁outputs▁begin｜>", False),
    ("<｜tool▁outputs▁end｜>", False),
    ("<｜tool▁output▁begin｜>", False),
    ("<｜tool▁output▁end｜>", False),
    ("<｜tool▁sep｜>", False),
    ("<｜begin▁of▁repo▁name｜>", False),
    ("<｜end▁of▁repo▁name｜>", False),
    ("<｜begin▁of▁file▁name｜>", False),
    ("<｜end▁of▁file▁name｜>", False),
    ("<｜begin▁of▁file｜>", False),
    ("<｜end▁of▁file｜>", False),
    ("<think>", False),
    ("</think>", False),
    ("<｜place▁holder▁for▁copy｜>", False),
    ("<｜place▁holder▁for▁pointer▁replace｜>", False),
    ("｜DSML｜", False),
    ("<｜begin▁sys｜>", False),
    ("<｜end▁sys｜>", False),
    ("<｜latest_reminder｜>", False),
    ("<｜action｜>", False),
    ("<｜query｜>", False),
    ("<｜authority｜>", False),
    ("<｜domain｜>", False),
    ("<｜task｜>", False),
    ("<｜political｜>", False),
    ("<｜entity｜>", False),
    ("<｜title｜>", False),
    ("<｜safety｜>", False),
    ("<｜answer｜>", False),
    ("<｜search｜>", False),
    ("<dsml:", False),
    ("</dsml:", False),
    ("<｜search▁begin｜>", False),
    ("<｜search▁end｜>", False),
    ("<｜extracted_url｜>", False),
    ("<｜read_url｜>", False),
    ("<｜end_of_query｜>", False),
    ("<｜image｜>", False),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--reference", required=True, help="DeepSeek tokenizer.json (sections copied)")
    ap.add_argument("--vocab-size", type=int, default=6144)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    ref = json.load(open(a.reference, encoding="utf-8"))
    skel = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": ref["normalizer"],
        "pre_tokenizer": ref["pre_tokenizer"],
        "post_processor": ref["post_processor"],
        "decoder": ref["decoder"],
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {}, "merges": []},
    }
    tok = Tokenizer.from_str(json.dumps(skel))
    trainer = trainers.BpeTrainer(
        vocab_size=a.vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=[c for c, _ in V4_ADDED],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    with open(a.corpus, encoding="utf-8") as fh:
        lines = fh.read().split("\n")
    tok.train_from_iterator(lines, trainer=trainer)

    # Re-apply the exact reference sections and DeepSeek's added-token flags.
    t = json.loads(tok.to_str())
    for k in ("normalizer", "pre_tokenizer", "post_processor", "decoder"):
        t[k] = ref[k]
    flags = dict(V4_ADDED)
    for e in t["added_tokens"]:
        sp = flags[e["content"]]
        e.update(single_word=False, lstrip=False, rstrip=False, normalized=not sp, special=sp)
    assert [e["id"] for e in t["added_tokens"]][:2] == [0, 1]
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "tokenizer.json"), "w", encoding="utf-8") as fh:
        json.dump(t, fh, ensure_ascii=False, indent=1)

    added = {"__type": "AddedToken", "lstrip": False, "normalized": True, "rstrip": False,
             "single_word": False}
    cfg = {
        "add_bos_token": False,
        "add_eos_token": False,
        "bos_token": dict(added, content="<｜begin▁of▁sentence｜>"),
        "clean_up_tokenization_spaces": False,
        "eos_token": dict(added, content="<｜end▁of▁sentence｜>"),
        "legacy": True,
        "model_max_length": 1048576,
        "pad_token": dict(added, content="<｜end▁of▁sentence｜>"),
        "sp_model_kwargs": {},
        "unk_token": None,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    with open(os.path.join(a.out, "tokenizer_config.json"), "w", encoding="utf-8") as fh:
        json.dump(cfg, fh, ensure_ascii=False, indent=2)
        fh.write("\n")

    tok2 = Tokenizer.from_file(os.path.join(a.out, "tokenizer.json"))
    print("vocab", tok2.get_vocab_size(), "added", len(t["added_tokens"]), "merges", len(t["model"]["merges"]))
    s = "<｜begin▁of▁sentence｜><｜User｜>Hello, world! 12345 naïve 中文 😀<｜Assistant｜></think>The list is sorted.<｜end▁of▁sentence｜>"
    ids = tok2.encode(s, add_special_tokens=False).ids
    print(ids)
    print(repr(tok2.decode(ids, skip_special_tokens=False)))
    assert tok2.decode(ids, skip_special_tokens=False) == s


if __name__ == "__main__":
    main()
