#!/usr/bin/env python3
"""Validate the committed oracle fixtures without torch (numpy only; CI-safe).

    python3 tools/check_fixtures.py [tests/fixtures]

For every fixture directory: parses config.json and every safetensors file (own reader:
F32/BF16/F8_E4M3/F8_E8M0/I8/I64), checks the shard index, that every quantized weight has a
scale of the documented grid (FP8: [ceil(out/128), ceil(in/128)]; MXFP4: [out, in/32]),
dequantizes them with the documented formulas (a numpy reference for docs/checkpoint-format.md),
and checks golden.safetensors' internal consistency (shapes, tokens = argmax of decode rows,
decode row 0 = last prefill row, chunk sizes sum to T, chunked/decode rows close to the
full forward). Exit status 1 on any problem.
"""

from __future__ import annotations

import json
import math
import os
import struct
import sys

import numpy as np

FP4_LUT = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0.0, -.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)


def _e4m3_lut() -> np.ndarray:
    lut = np.zeros(256, dtype=np.float32)
    for b in range(256):
        s = -1.0 if b & 0x80 else 1.0
        e = (b >> 3) & 0xF
        m = b & 7
        if e == 15 and m == 7:
            lut[b] = np.nan
        elif e == 0:
            lut[b] = s * (m / 8.0) * 2.0 ** -6
        else:
            lut[b] = s * (1 + m / 8.0) * 2.0 ** (e - 7)
    return lut


E4M3_LUT = _e4m3_lut()
NP_DTYPES = {"F32": np.float32, "I64": np.int64, "I8": np.int8, "BF16": np.uint16,
             "F8_E4M3": np.uint8, "F8_E8M0": np.uint8, "I32": np.int32, "F16": np.float16}


def read_safetensors(path: str) -> dict:
    """name -> (dtype_str, np.ndarray of the raw container type)"""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        count = int(np.prod(info["shape"])) if info["shape"] else 1
        arr = np.frombuffer(data, dtype=NP_DTYPES[info["dtype"]], count=count, offset=base + b)
        arr = arr.reshape(info["shape"])
        if arr.nbytes != e - b:
            raise ValueError(f"{path}: {name} byte size mismatch")
        out[name] = (info["dtype"], arr)
    return out


def to_f32(dt: str, a: np.ndarray) -> np.ndarray:
    if dt == "F32":
        return a.astype(np.float32)
    if dt == "BF16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    if dt == "F8_E4M3":
        return E4M3_LUT[a]
    if dt == "F8_E8M0":
        return np.ldexp(np.float32(1.0), a.astype(np.int32) - 127).astype(np.float32)
    raise ValueError(dt)


def dequant(w: tuple, s: tuple) -> np.ndarray:
    wdt, wa = w
    sdt, sa = s
    scale = to_f32(sdt, sa)
    if wdt == "I8":  # MXFP4
        u = wa.view(np.uint8)
        vals = np.stack([FP4_LUT[u & 15], FP4_LUT[u >> 4]], -1).reshape(u.shape[0], -1)
        if scale.shape != (vals.shape[0], vals.shape[1] // 32):
            raise ValueError(f"MXFP4 scale grid {scale.shape} for weight {vals.shape}")
        return vals * np.repeat(scale, 32, axis=1)
    q = to_f32(wdt, wa)
    out_f, in_f = q.shape
    if scale.shape != (math.ceil(out_f / 128), math.ceil(in_f / 128)):
        raise ValueError(f"FP8 scale grid {scale.shape} for weight {q.shape}")
    return q * np.repeat(np.repeat(scale, 128, 0), 128, 1)[:out_f, :in_f]


def check_fixture(d: str) -> list[str]:
    errs = []
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(d, "meta.json")) as f:
        meta = json.load(f)
    idx_path = os.path.join(d, "model.safetensors.index.json")
    tensors = {}
    if os.path.exists(idx_path):
        with open(idx_path) as f:
            idx = json.load(f)
        files = sorted(set(idx["weight_map"].values()))
        total = 0
        for fn in files:
            part = read_safetensors(os.path.join(d, fn))
            for k, v in part.items():
                if idx["weight_map"].get(k) != fn:
                    errs.append(f"{fn}: {k} not mapped to this shard in the index")
                total += v[1].nbytes
            tensors.update(part)
        if set(idx["weight_map"]) != set(tensors):
            errs.append("index weight_map and shard contents differ")
        if idx["metadata"]["total_size"] != total:
            errs.append(f"index total_size {idx['metadata']['total_size']} != {total}")
    else:
        tensors = read_safetensors(os.path.join(d, "model.safetensors"))

    n_deq = 0
    for k, (dt, a) in tensors.items():
        if k.endswith(".scale") and k[: -len("scale")] + "weight" in tensors:
            continue  # a block scale; HF internal `attn_hc.scale` / `ffn_hc.scale` are mHC params
        sk = k[: -len("weight")] + "scale"
        if sk in tensors:
            try:
                w = dequant((dt, a), tensors[sk])
                if not np.isfinite(w).all():
                    errs.append(f"{k}: non-finite after dequantization")
                n_deq += 1
            except ValueError as e:
                errs.append(f"{k}: {e}")
        elif dt in ("F8_E4M3", "I8"):
            errs.append(f"{k}: quantized weight without .scale")

    V = cfg["vocab_size"]
    g = {k: v[1] for k, v in read_safetensors(os.path.join(d, "golden.safetensors")).items()}
    T = g["prompt_ids"].shape[0]
    N = g["tokens"].shape[0]
    if g["prefill_logits"].shape != (T, V) or g["chunked_logits"].shape != (T, V):
        errs.append("prefill/chunked logits shape")
    if g["decode_logits"].shape != (N, V) or N < 24:
        errs.append("decode logits shape / N < 24")
    if int(g["chunk_sizes"].sum()) != T:
        errs.append("chunk sizes do not sum to T")
    if not np.array_equal(g["decode_logits"].argmax(-1), g["tokens"]):
        errs.append("tokens != argmax(decode_logits)")
    if not np.array_equal(g["decode_logits"][0], g["prefill_logits"][-1]):
        errs.append("decode row 0 != last prefill row")
    scale = np.abs(g["prefill_logits"]).max()
    rel = np.abs(g["chunked_logits"] - g["prefill_logits"]).max() / scale
    if rel > 1e-5:
        errs.append(f"chunked vs full rel err {rel:.2e}")
    if not (g["prompt_ids"] >= 0).all() or not (g["prompt_ids"] < V).all():
        errs.append("prompt ids out of range")
    if meta.get("name") != os.path.basename(os.path.normpath(d)):
        errs.append("meta.json name mismatch")
    print(f"{os.path.basename(d)}: {len(tensors)} tensors, {n_deq} dequantized, T={T} N={N} V={V}, "
          f"chunked rel {rel:.1e} -> {'OK' if not errs else 'FAIL'}")
    return errs


def main(argv: list[str]) -> int:
    root = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures")
    bad = 0
    for name in sorted(os.listdir(root)):
        d = os.path.join(root, name)
        if not os.path.isfile(os.path.join(d, "golden.safetensors")):
            continue
        for e in check_fixture(d):
            print(f"  {name}: {e}")
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
