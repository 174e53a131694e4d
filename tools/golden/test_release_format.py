"""Self-checks for release_format.py (run: .venv-golden/bin/python -m pytest tools/golden/test_release_format.py)."""
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import release_format as rf  # noqa: E402


def test_e4m3_table_known_values():
    assert rf.E4M3_TABLE[0x7E] == 448.0
    assert rf.E4M3_TABLE[0x01] == 2.0 ** -9
    assert rf.E4M3_TABLE[0x38] == 1.0
    assert np.isnan(rf.E4M3_TABLE[0x7F]) and np.isnan(rf.E4M3_TABLE[0xFF])


def test_e4m3_roundtrip_and_rne():
    codes = np.array([c for c in range(256) if c not in (0x7F, 0xFF)], dtype=np.uint8)
    assert np.array_equal(rf.e4m3_encode(rf.e4m3_decode(codes)), codes)
    # 1 + 1/16 is halfway between 1.0 (0x38, even) and 1.125 (0x39): tie -> even
    assert rf.e4m3_encode(np.array([1.0625]))[0] == 0x38
    assert rf.e4m3_encode(np.array([1.1875]))[0] == 0x3A  # between 0x39 and 0x3A -> even 0x3A
    assert rf.e4m3_encode(np.array([1e9]))[0] == 0x7E  # saturate
    assert rf.e4m3_encode(np.array([-1e9]))[0] == 0xFE


def test_e4m3_matches_torch_if_available():
    try:
        import torch
    except ImportError:
        return
    x = np.random.default_rng(0).standard_normal(100000).astype(np.float32) * 50
    x = np.clip(x, -448, 448)
    t = torch.from_numpy(x).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    assert np.array_equal(rf.e4m3_encode(x), t)


def test_e2m1_ties():
    v = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, -0.25, -5.0])
    got = rf.e2m1_decode(rf.e2m1_encode(v))
    assert np.array_equal(np.abs(got), [0, 1, 1, 2, 2, 4, 4, 6, 0, 4])
    assert got[-1] == -4.0


def test_bf16_matches_torch_if_available():
    try:
        import torch
    except ImportError:
        return
    x = np.random.default_rng(1).standard_normal(100000).astype(np.float32)
    t = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(rf.bf16_encode(x), t)


def test_fp8_block_quant():
    w = np.random.default_rng(2).standard_normal((300, 200)).astype(np.float32) * 0.05
    q, s, we = rf.quantize_fp8_block(w, 128)
    assert q.shape == (300, 200) and s.shape == (3, 2)
    assert np.array_equal(rf.dequantize_fp8_block(q, s, 128), we)
    assert np.max(np.abs(we - w)) <= np.max(np.abs(w)) * 2 ** -3
    # re-quantizing the effective weight is lossless
    q2, s2, we2 = rf.quantize_fp8_block(we, 128)
    assert np.array_equal(we2, we)


def test_mxfp4_quant():
    w = np.random.default_rng(3).standard_normal((16, 64)).astype(np.float32)
    p, s, we = rf.quantize_mxfp4(w)
    assert p.dtype == np.int8 and p.shape == (16, 32) and s.shape == (16, 2)
    assert np.array_equal(rf.dequantize_mxfp4(p, s), we)
    nib = rf.unpack_fp4(p)
    assert np.array_equal(nib[:, 0] | (nib[:, 1] << 4), p.view(np.uint8)[:, 0])
    _, _, we2 = rf.quantize_mxfp4(we)
    assert np.array_equal(we2, we)


def test_safetensors_roundtrip_and_shards():
    rng = np.random.default_rng(4)
    q, s, _ = rf.quantize_fp8_block(rng.standard_normal((130, 70)).astype(np.float32), 128)
    tensors = {
        "a.weight": rf.st_bf16(rng.standard_normal((5, 3))),
        "a.bias": rf.st_f32(rng.standard_normal(4)),
        "b.weight": rf.STensor("F8_E4M3", q),
        "b.scale": rf.STensor("F8_E8M0", s),
        "c.tid2eid": rf.st_i64(rng.integers(0, 8, (10, 2))),
        "d.weight": rf.STensor("I8", rng.integers(-128, 127, (4, 6)).astype(np.int8)),
    }
    with tempfile.TemporaryDirectory() as d:
        files = rf.write_checkpoint(d, tensors, n_shards=2, prefix="model.")
        assert "model.safetensors.index.json" in files
        back = rf.read_checkpoint(d, prefix="model.")
        assert set(back) == set(tensors)
        for k, v in tensors.items():
            assert back[k].dtype == v.dtype and np.array_equal(back[k].data, v.data)
        try:
            import torch
            from safetensors.torch import load_file
        except ImportError:
            return
        for fn in files[:-1]:
            t = load_file(os.path.join(d, fn))
            for k, v in t.items():
                src = tensors[k[len("model."):]]
                assert np.array_equal(rf._as_stensor(v).data, src.data), k
