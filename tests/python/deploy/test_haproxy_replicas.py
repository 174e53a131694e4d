"""Replicas behind HAProxy with session affinity, end to end: two `spillway serve` replicas of the bundled
demo model (CPU) behind real HAProxy running the shipped deploy/haproxy/spillway.cfg, driven by the
official openai and anthropic SDKs.

Which replica served a request is read from the replicas themselves: exactly one replica's
spillway_requests_finished_total grows by one per request (requests are sent one at a time). HAProxy's
X-Spillway-Replica header must name the same replica. HAProxy comes from Debian (scripts/setup.sh
installs it); without it the tests fail rather than skip, so CI cannot pass without running them.
"""
from __future__ import annotations

import contextlib
import csv
import io
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))
from spw_server_harness import API_KEY, ROOT, Server  # noqa: E402

CONFIG = ROOT / "deploy" / "haproxy" / "spillway.cfg"
DEMO = ROOT / "models" / "demo"
COUNTERS = ("spillway_requests_finished_total", "spillway_prompt_tokens_total", "spillway_prompt_tokens_cached_total")
# The first turn spans several 16-token prefix-cache blocks, so the next turn has a prefix to reuse.
OPENING = ("Here is a small Python module that parses a configuration file, validates every field against a "
           "schema and reports errors with line numbers. Explain what it does and suggest two improvements.")
FOLLOW_UPS = ["Now show the first improvement as code.", "And the second one, with a test."]


def haproxy_binary() -> str:
    found = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")
    if not found:
        pytest.fail("haproxy is not installed: run scripts/setup.sh (Debian package haproxy) to run the "
                    "replica tests")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Balancer:
    """haproxy -f deploy/haproxy/spillway.cfg in front of the given replicas, on free ports."""

    def __init__(self, replicas: list[Server], log_path: Path):
        self.port, self.stats_port = free_port(), free_port()
        env = dict(os.environ, SPILLWAY_LB_BIND=f"127.0.0.1:{self.port}",
                   SPILLWAY_LB_STATS=f"127.0.0.1:{self.stats_port}")
        for i, r in enumerate(replicas, 1):
            env[f"SPILLWAY_REPLICA_{i}"] = f"127.0.0.1:{r.port}"
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen([haproxy_binary(), "-db", "-f", str(CONFIG)], env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT)
        self.base = f"http://127.0.0.1:{self.port}"
        self.wait_status({f"r{i}": "UP" for i in range(1, len(replicas) + 1)}, timeout=15)

    def log_text(self) -> str:
        self.log.flush()
        return self.log_path.read_text()

    def status(self) -> dict[str, str]:
        """Each replica's state in HAProxy's stats (UP, DOWN, or a transition such as "UP 1/2")."""
        text = httpx.get(f"http://127.0.0.1:{self.stats_port}/;csv", timeout=5).text.lstrip("# ")
        return {row["svname"]: row["status"] for row in csv.DictReader(io.StringIO(text))
                if row["pxname"] == "spillway_replicas" and row["svname"] != "BACKEND"}

    def wait_status(self, want: dict[str, str], timeout: float) -> None:
        deadline = time.time() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"haproxy exited with {self.proc.returncode}:\n{self.log_text()}")
            with contextlib.suppress(httpx.HTTPError):
                got = self.status()
                if all(got.get(k) == v for k, v in want.items()):
                    return
            if time.time() > deadline:
                raise AssertionError(f"haproxy's replicas did not reach {want} in {timeout} s "
                                     f"(last: {got}):\n{self.log_text()}")
            time.sleep(0.1)

    def redispatched_to(self, name: str) -> int:
        """Requests that HAProxy retried on replica `name` after another failed: httplog's retries field
        (the fifth of the connection counters) reads +N when the retry went to another server."""
        pattern = re.compile(rf" spillway_replicas/{name} .* \d+/\d+/\d+/\d+/\+\d+ ")
        return sum(1 for line in self.log_text().splitlines() if pattern.search(line))

    def openai(self, session: str | None = None) -> openai.OpenAI:
        headers = {"X-Session-Id": session} if session else None
        return openai.OpenAI(base_url=self.base + "/v1", api_key=API_KEY, max_retries=0, timeout=60,
                             default_headers=headers)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(10)
        self.log.close()


class Cluster:
    def __init__(self, binary: str, log_path: Path, n: int = 2):
        haproxy_binary()
        self.replicas: list[Server] = []
        try:
            for _ in range(n):
                self.replicas.append(Server(binary, DEMO, "--device", "cpu"))
            self.lb = Balancer(self.replicas, log_path)
        except BaseException:
            for r in self.replicas:
                r.stop()
            raise

    def counters(self) -> list[dict[str, float] | None]:
        """COUNTERS of each replica; None for a stopped one."""
        out = []
        for r in self.replicas:
            m = r.metrics() if r.proc.poll() is None else None
            out.append(m and {k: m[k] for k in COUNTERS})
        return out

    def served_by(self, before: list[dict[str, float]]) -> tuple[int, dict[str, float]]:
        """The index of the one replica that finished a request since `before`, and its counter deltas."""
        deadline = time.time() + 10
        while True:
            after = self.counters()
            deltas = [None if a is None else {k: a[k] - b[k] for k in COUNTERS} for a, b in zip(after, before)]
            finished = [i for i, d in enumerate(deltas) if d and d["spillway_requests_finished_total"] > 0]
            if finished or time.time() > deadline:
                break
            time.sleep(0.02)
        assert len(finished) == 1 and deltas[finished[0]]["spillway_requests_finished_total"] == 1, deltas
        return finished[0], deltas[finished[0]]

    def stop(self) -> None:
        self.lb.stop()
        for r in self.replicas:
            assert r.stop() == 0, "".join(r.log[-30:])


@pytest.fixture(scope="module")
def spillway_bin() -> str:
    b = os.environ.get("SPILLWAY_BIN", str(ROOT / "build" / "bin" / "spillway"))
    if not os.path.exists(b):
        pytest.fail(f"spillway binary not found at {b} (build with scripts/build.sh or set SPILLWAY_BIN)")
    return b


@pytest.fixture(scope="module")
def cluster(spillway_bin, tmp_path_factory):
    c = Cluster(spillway_bin, tmp_path_factory.mktemp("haproxy") / "haproxy.log")
    yield c
    c.stop()


def chat_turn(cluster: Cluster, client: openai.OpenAI, messages: list[dict], **kw):
    """One request through HAProxy: (replica index, counter deltas there, parsed completion)."""
    kw.setdefault("max_tokens", 6)
    before = cluster.counters()
    raw = client.chat.completions.with_raw_response.create(model="demo", messages=messages, temperature=0, **kw)
    done = raw.parse()
    i, delta = cluster.served_by(before)
    assert raw.headers["x-spillway-replica"] == f"r{i + 1}"
    return i, delta, done


def opening() -> str:
    """The first message of a new conversation: a unique start, so only its own turns share its prefix."""
    return f"Ticket {uuid.uuid4()}. {OPENING}"


def converse(cluster: Cluster, client: openai.OpenAI, **kw) -> None:
    """Three turns of one conversation; asserts they share a replica whose prefix cache serves turns 2 and 3."""
    messages = [{"role": "user", "content": opening()}]
    home, prev_prompt = None, 0
    for turn in range(3):
        i, delta, done = chat_turn(cluster, client, messages, **kw)
        home = i if home is None else home
        assert i == home, f"turn {turn + 1} went to replica {i + 1}, earlier turns to {home + 1}"
        assert delta["spillway_prompt_tokens_total"] == done.usage.prompt_tokens
        cached = delta["spillway_prompt_tokens_cached_total"]
        assert cached == done.usage.prompt_tokens_details.cached_tokens
        if turn == 0:
            assert cached == 0
        else:
            # The previous turn's prompt is a prefix of this one. Its state was cached at its last 16-token
            # boundary that left a piece of at least two tokens (docs/server.md, *Determinism under load*).
            assert cached >= (prev_prompt - 2) // 16 * 16 > 0, (turn, cached, prev_prompt)
        prev_prompt = done.usage.prompt_tokens
        if turn < 2:
            messages += [{"role": "assistant", "content": done.choices[0].message.content},
                         {"role": "user", "content": FOLLOW_UPS[turn]}]


def test_each_conversation_stays_on_one_replica_with_a_warm_prefix_cache(cluster):
    for _ in range(4):  # keyed by the X-Session-Id header
        converse(cluster, cluster.lb.openai(session=f"conv-{uuid.uuid4()}"))
    for _ in range(2):  # keyed by the OpenAI body's `user` field, no header
        converse(cluster, cluster.lb.openai(), user=f"user-{uuid.uuid4()}")


def test_anthropic_metadata_user_id_keeps_a_conversation_on_one_replica(cluster):
    client = anthropic.Anthropic(base_url=cluster.lb.base, api_key=API_KEY, max_retries=0, timeout=60)
    meta = {"user_id": f"session-{uuid.uuid4()}"}
    messages = [{"role": "user", "content": opening()}]
    seen = []
    for turn in range(3):
        before = cluster.counters()
        raw = client.messages.with_raw_response.create(model="demo", max_tokens=6, messages=messages,
                                                       metadata=meta, extra_body={"temperature": 0})
        reply = raw.parse()
        i, delta = cluster.served_by(before)
        assert raw.headers["x-spillway-replica"] == f"r{i + 1}"
        assert (delta["spillway_prompt_tokens_cached_total"] > 0) == (turn > 0), (turn, delta)
        seen.append(i)
        if turn < 2:
            messages += [{"role": "assistant", "content": "".join(b.text for b in reply.content) or "ok"},
                         {"role": "user", "content": FOLLOW_UPS[turn]}]
    assert len(set(seen)) == 1, seen


def test_sessions_spread_over_both_replicas(cluster):
    """24 random session ids: each lands on replica 1 with probability p, measured at 0.48 over 3000 keys
    (0.46..0.50 at 95 %). All 24 on one replica: p^24 + (1 - p)^24 <= 0.54^24 + 0.46^24 < 4e-7."""
    counts = [0, 0]
    for _ in range(24):
        i, _, _ = chat_turn(cluster, cluster.lb.openai(session=str(uuid.uuid4())),
                            [{"role": "user", "content": "Hi"}], max_tokens=1)
        counts[i] += 1
    assert min(counts) > 0, counts


def test_requests_without_a_key_share_the_client_address_replica(cluster):
    # Without the source-address fallback, HAProxy would hash nothing and take turns (round robin).
    client = cluster.lb.openai()
    seen = {chat_turn(cluster, client, [{"role": "user", "content": f"Question {k}"}])[0] for k in range(4)}
    assert len(seen) == 1, seen


def test_streams_pass_through_unbuffered(cluster):
    client = cluster.lb.openai(session="stream-session")
    args = dict(model="demo", messages=[{"role": "user", "content": "Write a loop."}], temperature=0,
                max_tokens=32, extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**args).choices[0].message.content
    start, times, text = time.monotonic(), [], ""
    for chunk in client.chat.completions.create(stream=True, **args):
        if chunk.choices and chunk.choices[0].delta.content:
            times.append(time.monotonic() - start)
            text += chunk.choices[0].delta.content
    assert text == whole
    # Tokens arrive as they are made: spread over the decode, not all at once at the end. Buffered,
    # every chunk would come within a millisecond of the last.
    assert len(times) > 8 and times[-1] - times[0] > 0.25 * times[-1], times


def replica_of_each_session(c: Cluster) -> dict[str, int]:
    """New session ids until both replicas serve at least one (each first turn's replica)."""
    sessions: dict[str, int] = {}
    while len(set(sessions.values())) < 2:
        sid = str(uuid.uuid4())
        sessions[sid] = chat_turn(c, c.lb.openai(session=sid), [{"role": "user", "content": "Hi"}])[0]
    return sessions


def test_a_replica_stopped_mid_stream_drains_then_its_sessions_move(spillway_bin, tmp_path):
    """SIGTERM to a replica with a stream in flight (a rolling restart): the stream finishes, the replica's
    other sessions are answered by the survivor at once (its 503s while draining are retried there),
    and the health check takes it out."""
    c = Cluster(spillway_bin, tmp_path / "haproxy.log")
    try:
        sessions = replica_of_each_session(c)
        gone, survivor = 0, 1
        moving = [sid for sid, i in sessions.items() if i == gone]
        streamed: list[str] = []
        started = threading.Event()

        def stream():
            for chunk in c.lb.openai(session=moving[0]).chat.completions.create(
                    model="demo", messages=[{"role": "user", "content": "Write a long story."}], max_tokens=200,
                    temperature=0, stream=True, stream_options={"include_usage": True},
                    extra_body={"ignore_eos": True}):
                if chunk.choices and chunk.choices[0].delta.content:
                    started.set()
                if chunk.usage:
                    streamed.append(f"{chunk.usage.completion_tokens}")
                if chunk.choices and chunk.choices[0].finish_reason:
                    streamed.append(chunk.choices[0].finish_reason)

        in_flight = threading.Thread(target=stream)
        in_flight.start()
        assert started.wait(30)
        c.replicas[gone].proc.send_signal(signal.SIGTERM)
        assert httpx.get(c.replicas[gone].base + "/health", timeout=5).status_code == 503  # draining
        for sid in moving:
            survivor_before = c.replicas[survivor].metrics()["spillway_requests_finished_total"]
            raw = c.lb.openai(session=sid).chat.completions.with_raw_response.create(
                model="demo", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
            assert raw.headers["x-spillway-replica"] == f"r{survivor + 1}"
            assert raw.parse().choices[0].message.content is not None
            c.replicas[survivor].wait_metric("spillway_requests_finished_total", lambda v: v > survivor_before)
        assert in_flight.is_alive(), "the stream ended before the draining replica was asked: lengthen it"
        assert c.lb.redispatched_to(f"r{survivor + 1}") >= 1, c.lb.log_text()  # the draining replica's 503s
        in_flight.join(60)
        assert streamed == ["length", "200"], streamed
        assert c.replicas[gone].proc.wait(30) == 0, "".join(c.replicas[gone].log[-30:])
        c.lb.wait_status({f"r{gone + 1}": "DOWN", f"r{survivor + 1}": "UP"}, timeout=10)
        # Taken out: every session now lands on the survivor, and stays there turn after turn.
        for sid in sessions:
            for _ in range(2):
                assert chat_turn(c, c.lb.openai(session=sid), [{"role": "user", "content": "Hi"}])[0] == survivor
    finally:
        c.stop()


def test_a_killed_replica_is_taken_out_and_its_sessions_move(spillway_bin, tmp_path):
    """SIGKILL (a crash): requests before the health check notices get a refused connection, retried on
    the survivor; then the check marks the replica down."""
    c = Cluster(spillway_bin, tmp_path / "haproxy.log")
    try:
        sessions = replica_of_each_session(c)
        gone, survivor = 0, 1
        c.replicas[gone].stop(signal.SIGKILL)
        # The killed replica's sessions first, before two failed checks (1 s apart) take it out.
        for sid in sorted(sessions, key=lambda sid: sessions[sid] != gone):
            assert chat_turn(c, c.lb.openai(session=sid), [{"role": "user", "content": "Hi"}])[0] == survivor
        assert c.lb.redispatched_to(f"r{survivor + 1}") >= 1, c.lb.log_text()  # refused, then retried
        c.lb.wait_status({f"r{gone + 1}": "DOWN", f"r{survivor + 1}": "UP"}, timeout=10)
        for sid in sessions:
            assert chat_turn(c, c.lb.openai(session=sid), [{"role": "user", "content": "Hi"}])[0] == survivor
    finally:
        c.lb.stop()
        assert c.replicas[survivor].stop() == 0
