"""Fixtures for the `spillway serve` end-to-end suite (harness in spw_server_harness.py).

The server runs the tiny random-weight V4.1 fixture, or the model $SPILLWAY_TEST_MODEL names, from a
temporary folder that links its files and gets the byte-level BPE tokenizer.json trained in
spw_server_harness.py. The binary comes from $SPILLWAY_BIN (scripts/test.sh sets it). Every server inherits the
environment, so SPILLWAY_DEVICE=cuda runs the whole suite on the GPU runner (scripts/gpu_serve.sh).
"""
from __future__ import annotations

import os
from pathlib import Path

import openai
import pytest
from tokenizers import Tokenizer

from spw_server_harness import MODEL, ROOT, Server, build_tokenizer, link_model


@pytest.fixture(scope="session")
def spillway_bin() -> str:
    b = os.environ.get("SPILLWAY_BIN", str(ROOT / "build" / "bin" / "spillway"))
    if not os.path.exists(b):
        pytest.fail(f"spillway binary not found at {b} (build with scripts/build.sh or set SPILLWAY_BIN)")
    return b


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("model") / "tiny-v41"  # the served model id, whatever the weights
    link_model(MODEL, d)
    build_tokenizer(d / "tokenizer.json")
    return d


@pytest.fixture(scope="session")
def server(spillway_bin, model_dir):
    s = Server(spillway_bin, model_dir, "--max-tokens-limit", "4096", "--max-model-len", "8192")
    yield s
    rc = s.stop()
    assert rc == 0, "".join(s.log[-30:])


@pytest.fixture()
def client(server) -> openai.OpenAI:
    return server.client()


@pytest.fixture(scope="session")
def tokenizer(model_dir) -> Tokenizer:
    return Tokenizer.from_file(str(model_dir / "tokenizer.json"))
