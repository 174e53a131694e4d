"""The oracle's generalised Engram constants reproduce the released V4.1-Flash numbers (spec 5.4).

    .venv-golden/bin/python -m pytest -q tools/golden/test_engram_constants.py
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oracle_v41 import engram_layout, engram_multipliers  # noqa: E402

REAL = dict(engram_layer_ids=[1, 14], engram_max_ngram_size=4, engram_n_heads=8, engram_vocab_size=16000000)


def test_multiplier_bound():
    assert (np.iinfo(np.int64).max // 99092) // 2 == 46539438283891


def test_multipliers_real_config():
    m = engram_multipliers([1, 14], 4, 99092)
    assert m.dtype == np.int64
    assert m[0].tolist() == [76632096046245, 4839876093313, 35959672319349, 73987337458391]
    assert m[1].tolist() == [67716810739261, 51510806800915, 30921347202721, 82619226485591]
    assert (m % 2 == 1).all()


def test_primes_offsets_rows_real_config():
    primes, offsets, rows = engram_layout(REAL)
    flat1 = [p for per in primes[0] for p in per]
    flat14 = [p for per in primes[1] for p in per]
    assert flat1[:3] == [16000057, 16000079, 16000081]
    assert flat14[-3:] == [16000877, 16000879, 16000889]
    assert len(flat1) == len(flat14) == 24
    assert len(set(flat1 + flat14)) == 48  # never reused
    assert rows == [384006168, 384016682]
    assert offsets[0][0] == 0 and offsets[0][1] == 16000057 and offsets[0][-1] == 384006168 - flat1[-1]
    # each n-gram size restarts the search at engram_vocab_size: its first head prime is the smallest unused
    for layer in primes:
        for per in layer:
            assert per == sorted(per)


def test_tiny_config_layout():
    tiny = dict(engram_layer_ids=[1, 4], engram_max_ngram_size=4, engram_n_heads=2, engram_vocab_size=1000)
    primes, _, rows = engram_layout(tiny)
    assert primes == [[[1009, 1013], [1019, 1021], [1031, 1033]], [[1039, 1049], [1051, 1061], [1063, 1069]]]
    assert rows == [6126, 6332]
