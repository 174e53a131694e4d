"""Harness for the `spillway serve` end-to-end suite: the tokenizer trained for the fixture model
and a Server class that runs one `spillway serve` process.

The server runs the tiny random-weight V4.1 fixture (tests/golden/fixtures/v41/model, vocab 1024,
EOS id 1), or the model directory $SPILLWAY_TEST_MODEL names (the demo model, a synthetic full-width
model: any V4 / V4.1 checkpoint with BOS 0 and EOS 1), from a temporary folder that links its files
and gets a byte-level BPE tokenizer.json trained here with `tokenizers`: DeepSeek's special tokens at
ids 0.. (BOS 0, EOS 1, PAD 2), about 1000 trained tokens, and filler tokens up to the model's vocabulary
so that every id the model can produce decodes. A filler's bytes start with 0xFF, never valid UTF-8, so
the tool-call and response_format grammars never allow one: a random model then finishes a constrained
call as it does on the fixture's 1024 tokens (with 128K text tokens beside the one that closes a string,
a random model never closes it). The suite's prompts and assertions rest on
this one tokenizer whatever the weights; the tests check protocol behaviour, determinism and
robustness, not quality. The binary comes from $SPILLWAY_BIN (scripts/test.sh sets it).
"""
from __future__ import annotations

import json
import random
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = Path(__file__).resolve().parents[3]
FIXTURE = ROOT / "tests" / "golden" / "fixtures" / "v41" / "model"
MODEL = Path(os.environ.get("SPILLWAY_TEST_MODEL") or FIXTURE)


def model_vocab(model: Path) -> int:
    cfg = json.loads((model / "config.json").read_text())
    return int(cfg.get("text_config", cfg)["vocab_size"])


# Token ids run 0 .. VOCAB - 1; 0 when the model is absent (tools that import only Server travel without the
# fixture; the suite's model_dir fixture then fails on the missing folder).
VOCAB = model_vocab(MODEL) if (MODEL / "config.json").is_file() else 0
API_KEY = "sk-spillway-test"

SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<｜User｜>", "<｜Assistant｜>",
            "<｜System｜>", "<think>", "</think>", "｜DSML｜", "<｜latest_reminder｜>", "<｜deepseek_image｜>"]

CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Spillway serves DeepSeek models through an OpenAI-compatible API with continuous batching.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n",
    "Weather in Paris: sunny, 21 degrees. Weather in Berlin: cloudy, 17 degrees.",
    '{"location": "Paris", "unit": "celsius", "query": "weather", "results": [1, 2, 3]}',
    "Hello world! How are you today? I am fine, thank you. What is the capital of France?",
    "tool_calls invoke parameter name string true false calls Reasoning Effort range thorough",
    "## Tools\nYou have access to the following tools. Use them when needed.\n",
]


def link_model(model: Path, dest: Path) -> None:
    """dest: a folder with model's files linked in, less its tokenizer (build_tokenizer writes one)."""
    if not (model / "config.json").is_file():
        raise FileNotFoundError(f"no model at {model} (SPILLWAY_TEST_MODEL names a model folder)")
    dest.mkdir(parents=True)
    for f in model.iterdir():
        if f.is_file() and not f.name.startswith("tokenizer"):
            (dest / f.name).symlink_to(f.resolve())


def build_tokenizer(path: Path, vocab_size: int = VOCAB) -> None:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1000, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 7))) for _ in range(600)]
    extra = [" ".join(rng.choice(words) for _ in range(40)) for _ in range(200)]
    tok.train_from_iterator(CORPUS * 20 + extra, trainer)
    j = json.loads(tok.to_str())
    for t in j["added_tokens"]:
        t["special"] = t["content"] in SPECIALS[:3]
    assert [t["id"] for t in j["added_tokens"]] == list(range(len(SPECIALS)))
    vocab = j["model"]["vocab"]
    assert max(vocab.values()) < 1024 <= vocab_size
    next_id, n = max(vocab.values()) + 1, 0
    while next_id < vocab_size:  # fillers: never produced by the merges, so prompts never contain them
        filler = f"\u00ffzq{n}"  # byte-level 'ÿ' is byte 0xFF
        n += 1
        if filler not in vocab:
            vocab[filler] = next_id
            next_id += 1
    path.write_text(json.dumps(j, ensure_ascii=False), encoding="utf-8")


class Server:
    """One `spillway serve` process on a free port (--port 0; the port is read from its log)."""

    def __init__(self, binary: str, model: Path, *args: str, api_key: str | None = API_KEY):
        cmd = [binary, "serve", "--model", str(model), "--port", "0", "--threads", "2", *args]
        if api_key:
            cmd += ["--api-key", api_key]
        self.api_key = api_key
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.log: list[str] = []
        port_seen = threading.Event()
        self.port = 0

        def pump():
            for line in self.proc.stdout:
                self.log.append(line)
                m = re.search(r"on http://[^:]+:(\d+)", line)
                if m and not self.port:
                    self.port = int(m.group(1))
                    port_seen.set()

        threading.Thread(target=pump, daemon=True).start()
        if not port_seen.wait(60):
            self.proc.kill()
            raise RuntimeError("server did not start:\n" + "".join(self.log))
        self.base = f"http://127.0.0.1:{self.port}"
        for _ in range(100):
            try:
                if httpx.get(self.base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.05)

    def client(self, **kw) -> openai.OpenAI:
        import openai  # here, so tools that only start servers (tools/serve) need no openai package

        return openai.OpenAI(base_url=self.base + "/v1", api_key=self.api_key or "none", max_retries=0,
                             timeout=kw.pop("timeout", 120), **kw)

    def async_client(self, **kw) -> openai.AsyncOpenAI:
        import openai

        return openai.AsyncOpenAI(base_url=self.base + "/v1", api_key=self.api_key or "none", max_retries=0,
                                  timeout=kw.pop("timeout", 300), **kw)

    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def metrics(self) -> dict[str, float]:
        text = httpx.get(self.base + "/metrics", timeout=10).text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def wait_metric(self, name: str, pred, timeout: float = 10.0) -> float:
        deadline = time.time() + timeout
        while True:
            v = self.metrics()[name]
            if pred(v) or time.time() > deadline:
                return v
            time.sleep(0.05)

    def stop(self, sig=signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
