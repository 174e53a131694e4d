#!/usr/bin/env python3
"""Copies the EXL3 routed-expert tensors of a `spillway quantize` pack into one small safetensors file.

The pack's shards also hold every non-expert tensor (the whole model); the GPU machine's transfer limit and the
exllamav3 check (tools/exl3/check_pack_exllamav3.py) only need the experts: `<prefix>.trellis`, `.suh`, `.svh`
and the codebook marker `.mcg` / `.mul1`. Pure Python (no numpy/torch): the bytes are copied as stored.
Usage: extract_pack_tensors.py PACK_DIR OUT.safetensors
"""
import json
import os
import struct
import sys

EXL3_PARTS = (".trellis", ".suh", ".svh", ".mcg", ".mul1", ".bias")


def read_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)), 8 + n


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    pack, out = sys.argv[1], sys.argv[2]
    index = json.load(open(os.path.join(pack, "model.safetensors.index.json")))["weight_map"]
    names = sorted(n for n in index if ".ffn.experts." in n and n.endswith(EXL3_PARTS))
    if not any(n.endswith(".trellis") for n in names):
        sys.exit(f"{pack}: no EXL3 expert tensors (*.trellis) in model.safetensors.index.json")
    header, blobs, offset = {}, [], 0
    headers = {}
    for name in names:
        shard = os.path.join(pack, index[name])
        if shard not in headers:
            headers[shard] = read_header(shard)
        h, data_start = headers[shard]
        info = h[name]
        b, e = info["data_offsets"]
        with open(shard, "rb") as f:
            f.seek(data_start + b)
            blob = f.read(e - b)
        header[name] = {"dtype": info["dtype"], "shape": info["shape"], "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(out, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)
    print(f"{out}: {len(names)} tensors, {offset} bytes")


if __name__ == "__main__":
    main()
