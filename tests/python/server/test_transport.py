"""The HTTP transport under hostile or unusual clients: body limits enforced while a body arrives
(chunked too) and before it is read, the API key checked before the body, slow-header clients that
must not starve /health, bodies dripped slower than the minimum rate, shutdown whatever clients do, a port already in use, curl's
`Expect: 100-continue` form bodies, the Bearer scheme in any case, 405 with Allow, /v1/models/{id}.
Raw sockets where a client library would hide the behaviour."""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import threading
import time

import httpx
import pytest

from spw_server_harness import API_KEY, Server

HEADER_TIMEOUT_S = 2


@pytest.fixture(scope="module")
def transport_server(spillway_bin, model_dir):
    s = Server(spillway_bin, model_dir, "--http-header-timeout", str(HEADER_TIMEOUT_S), "--http-threads", "16")
    yield s
    rc = s.stop()
    assert rc == 0, "".join(s.log[-30:])


def connect(server, timeout=5.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=timeout)


def read_reply(sock: socket.socket) -> tuple[int, dict, bytes]:
    """One HTTP response: status, headers (lower-case names), body (by Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a reply; got {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    n = int(headers.get("content-length", "0"))
    while len(body) < n:
        chunk = sock.recv(65536)
        assert chunk, "connection closed mid-body"
        body += chunk
    return status, headers, body[:n]


def memory_kib(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1])
    return out


def send_until_refused(sock: socket.socket, chunks, limit_s: float) -> int:
    """Sends `chunks` until the server stops taking them (it answered and closed); bytes sent."""
    sent = 0
    deadline = time.time() + limit_s
    sock.settimeout(1.0)
    try:
        for chunk in chunks:
            if time.time() > deadline:
                break
            sock.sendall(chunk)
            sent += len(chunk)
    except (BrokenPipeError, ConnectionResetError, socket.timeout):
        pass
    return sent


def reset_peak_rss(pid: int) -> None:
    """VmHWM := VmRSS (Linux ≥ 4.0: clear_refs 5), so the peak measures what comes next, not model loading."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


def test_chunked_body_over_the_limit_is_refused_while_it_arrives(transport_server):
    pid = transport_server.proc.pid
    reset_peak_rss(pid)
    before = memory_kib(pid)
    s = connect(transport_server)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + API_KEY.encode() +
              b"\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    piece = b"a" * (1 << 20)
    chunk = b"%x\r\n" % len(piece) + piece + b"\r\n"
    sent = send_until_refused(s, (chunk for _ in range(200)), limit_s=20)
    status, _, body = read_reply(s)
    s.close()
    after = memory_kib(pid)
    assert status == 413, body
    assert "--max-body-bytes" in json.loads(body)["error"]["message"]
    # The default limit is 8 MiB: the server stopped reading soon after it, not at 200 MiB.
    assert sent < 64 << 20, f"the server took {sent >> 20} MiB of a body over an 8 MiB limit"
    grew_mib = (after["VmHWM"] - before["VmRSS"]) / 1024
    assert grew_mib < 128, f"peak RSS grew by {grew_mib:.0f} MiB for a refused body"


def test_declared_body_over_the_limit_is_refused_before_it_is_read(transport_server):
    s = connect(transport_server, timeout=2)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + API_KEY.encode() +
              b"\r\nContent-Type: application/json\r\nContent-Length: 209715200\r\n\r\n")
    status, headers, _ = read_reply(s)  # no body byte was sent: an answer now was given without one
    s.close()
    assert status == 413
    assert headers.get("connection") == "close"


@pytest.mark.parametrize("framing", [b"Content-Length: 100000\r\n", b"Transfer-Encoding: chunked\r\n"])
def test_wrong_api_key_is_refused_before_the_body_is_read(transport_server, framing):
    s = connect(transport_server, timeout=2)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\n"
              b"Content-Type: application/json\r\n" + framing + b"\r\n")
    status, _, body = read_reply(s)
    s.close()
    assert status == 401
    assert json.loads(body)["error"]["code"] == "invalid_api_key"


def test_health_answers_under_300_slow_header_connections(transport_server):
    slow = []
    for _ in range(300):
        s = connect(transport_server)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        slow.append(s)
    stop = threading.Event()

    def trickle():  # one more header line per connection every 0.3 s: never a whole head
        i = 0
        while not stop.wait(0.3):
            for s in slow:
                try:
                    s.sendall(b"X-Slow-%d: 1\r\n" % i)
                except OSError:
                    pass
            i += 1

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    try:
        time.sleep(0.5)
        for _ in range(5):
            start = time.time()
            r = httpx.get(transport_server.base + "/health", timeout=1.0)
            assert r.status_code == 200
            assert time.time() - start < 1.0
            time.sleep(0.2)
        # The header timeout ends the slow heads (408) within a few seconds.
        slow[0].settimeout(HEADER_TIMEOUT_S + 3)
        status, _, _ = read_reply(slow[0])
        assert status == 408
    finally:
        stop.set()
        t.join()
        for s in slow:
            s.close()


def drip_body(server, body: bytes, bytes_per_tick: int, tick_s: float, limit_s: float):
    """POSTs `body` to /tokenize a few bytes per tick. Returns (status or None if the server closed
    without a reply, seconds from the head to the reply or close)."""
    s = connect(server, timeout=limit_s)
    s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Authorization: Bearer %s\r\nContent-Length: %d\r\n\r\n" % (API_KEY.encode(), len(body)))
    start = time.time()
    try:
        for i in range(0, len(body), bytes_per_tick):
            s.sendall(body[i:i + bytes_per_tick])
            time.sleep(tick_s)
    except (BrokenPipeError, ConnectionResetError):
        pass
    try:
        status = read_reply(s)[0]
    except (AssertionError, ConnectionResetError):
        status = None
    s.close()
    return status, time.time() - start


def test_bodies_dripped_below_the_minimum_rate_are_dropped(spillway_bin, model_dir):
    """Four threads (the fewest), four clients dripping bodies at 100 B/s against a 400 B/s minimum
    after a 1 s read timeout: each is dropped within seconds, and /health answers again; a body at
    1000 B/s, longer in total than the read timeout, is served."""
    server = Server(spillway_bin, model_dir, "--http-threads", "4", "--http-read-timeout", "1",
                    "--http-min-body-rate", "400")
    try:
        slow_body = json.dumps({"prompt": "hi"}).encode() + b" " * 5000
        results = [None] * 4

        def drip(i):
            results[i] = drip_body(server, slow_body, 10, 0.1, limit_s=20)

        threads = [threading.Thread(target=drip, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        for status, seconds in results:
            assert status in (None, 400, 408), status
            assert seconds < 4, seconds  # 1 s + bytes/400 overtakes the 100 B/s drip after ~1.3 s
        assert httpx.get(server.base + "/health", timeout=5).status_code == 200

        body = json.dumps({"prompt": "hello"}).encode() + b" " * 2500
        status, seconds = drip_body(server, body, 100, 0.1, limit_s=20)
        assert status == 200 and seconds > 2, (status, seconds)
    finally:
        assert server.stop() == 0, "".join(server.log[-30:])


def test_sigterm_exits_in_the_grace_period_whatever_clients_do(spillway_bin, model_dir):
    grace_s = 1
    srv = Server(spillway_bin, model_dir, "--shutdown-grace", str(grace_s))
    socks = []
    try:
        half_head = connect(srv)
        half_head.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        half_body = connect(srv)
        half_body.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + API_KEY.encode() +
                          b"\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"prompt\": ")
        idle = connect(srv)
        idle.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_reply(idle)[0] == 200
        socks = [half_head, half_body, idle]
        time.sleep(0.3)  # the half-sent body is being read by a worker
        start = time.time()
        srv.proc.send_signal(signal.SIGTERM)
        try:
            rc = srv.proc.wait(grace_s + 4)
        except subprocess.TimeoutExpired:
            rc = None
        took = time.time() - start
    finally:
        srv.stop(sig=signal.SIGKILL)
        for s in socks:
            s.close()
    assert rc == 0, f"exit code {rc} after {took:.1f} s:\n" + "".join(srv.log[-20:])


def test_second_server_on_a_taken_port_fails_clearly(spillway_bin, model_dir, transport_server):
    p = subprocess.Popen([spillway_bin, "serve", "--model", str(model_dir), "--port", str(transport_server.port),
                          "--threads", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
        pytest.fail("a second server started on a port already in use:\n" + out)
    assert p.returncode != 0
    assert "in use" in out, out
    assert httpx.get(transport_server.base + "/health", timeout=5).status_code == 200


def test_curl_style_form_body_with_expect_100_continue(transport_server):
    """curl -d sends a form content type and, for large bodies, Expect: 100-continue."""
    body = json.dumps({"prompt": "hello " * 3400}).encode()
    assert len(body) > 20000
    s = connect(transport_server)
    s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + API_KEY.encode() +
              b"\r\nContent-Type: application/x-www-form-urlencoded\r\nExpect: 100-continue\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body))
    status, _, _ = read_reply(s)
    assert status == 100
    s.sendall(body)
    status, _, reply = read_reply(s)
    s.close()
    assert status == 200, reply
    assert len(json.loads(reply)["tokens"]) > 3000


def test_expect_100_continue_with_a_wrong_key_gets_401_not_100(transport_server):
    s = connect(transport_server, timeout=2)
    s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\nExpect: 100-continue\r\n"
              b"Content-Type: application/json\r\nContent-Length: 30000\r\n\r\n")
    status, _, _ = read_reply(s)
    s.close()
    assert status == 401


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "Bearer"])
def test_bearer_scheme_is_case_insensitive(transport_server, scheme):
    r = httpx.get(transport_server.base + "/v1/models", headers={"Authorization": f"{scheme} {API_KEY}"}, timeout=10)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("method,path,allow", [
    ("GET", "/v1/completions", "POST"),
    ("GET", "/v1/chat/completions", "POST"),
    ("PUT", "/tokenize", "POST"),
    ("POST", "/health", "GET, HEAD"),
    ("DELETE", "/v1/models", "GET, HEAD"),
])
def test_wrong_method_gets_405_with_allow(transport_server, method, path, allow):
    r = httpx.request(method, transport_server.base + path, headers=transport_server.headers(), timeout=10)
    assert r.status_code == 405, r.text
    assert r.headers["allow"] == allow
    err = r.json()["error"]
    assert err["code"] == "method_not_allowed" and allow in err["message"]


def test_model_by_id(transport_server, model_dir):
    r = httpx.get(transport_server.base + "/v1/models/" + model_dir.name, headers=transport_server.headers(),
                  timeout=10)
    assert r.status_code == 200, r.text
    assert r.json()["id"] == model_dir.name and r.json()["object"] == "model"
    r = httpx.get(transport_server.base + "/v1/models/no-such-model", headers=transport_server.headers(), timeout=10)
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "model_not_found"
    assert httpx.get(transport_server.base + "/v1/models/" + model_dir.name, timeout=10).status_code == 401


def test_unknown_path_is_404_and_the_server_keeps_serving(transport_server):
    r = httpx.post(transport_server.base + "/v2/nothing", content=b"x" * 100, timeout=10)
    assert r.status_code == 404
    assert r.json()["error"]["type"] == "not_found_error"
    assert httpx.get(transport_server.base + "/health", timeout=5).status_code == 200
