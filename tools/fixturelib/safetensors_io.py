"""Minimal, dependency-light safetensors writer/reader used by the fixture tools.

We write the official DeepSeek-V4 style files ourselves so that we control the exact
on-disk dtype strings (F8_E4M3, F8_E8M0, I8, BF16, F32, I64) and tensor order.
Tensors are given as (dtype_string, shape, raw little-endian bytes).
"""

from __future__ import annotations

import json
import struct

import numpy as np

DTYPE_SIZES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
    "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
}


def write_safetensors(path: str, tensors: dict, metadata: dict | None = None) -> int:
    """tensors: name -> (dtype_str, shape tuple, bytes). Keys are written sorted (like
    safetensors' own writer). Returns file size in bytes."""
    header = {}
    offset = 0
    names = sorted(tensors)
    for name in names:
        dt, shape, data = tensors[name]
        n = int(np.prod(shape)) if len(shape) else 1
        if len(data) != n * DTYPE_SIZES[dt]:
            raise ValueError(f"{name}: {len(data)} bytes for {dt}{list(shape)}")
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    if metadata is not None:
        header["__metadata__"] = metadata
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for name in names:
            f.write(tensors[name][2])
    return 8 + len(hjson) + offset


def read_header(path: str) -> dict:
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))
