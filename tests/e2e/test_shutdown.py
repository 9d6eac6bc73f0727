"""Graceful shutdown: SIGTERM lets running streams finish (final chunk + [DONE]), refuses new
requests with 503 while draining, and the process exits 0; a second signal ends the open requests
with a shutting_down error and exits 128 + the signal."""
import json
import signal
import threading
import time

import requests

from conftest import Server


def long_stream(srv, max_tokens, result, started):
    """A thread body streaming a greedy completion of `max_tokens` tokens: its SSE payloads go to
    result["events"] (set `started` at the first), a cut connection to result["stream_error"]."""
    def stream():
        try:
            with requests.post(srv.base + "/v1/completions", headers=srv.headers(), stream=True,
                               timeout=120,
                               json={"prompt": [5, 6, 7, 8], "max_tokens": max_tokens,
                                     "temperature": 0, "ignore_eos": True, "stream": True}) as r:
                events = []
                for line in r.iter_lines():
                    if line.startswith(b"data: "):
                        events.append(line.decode()[6:])
                        started.set()
                result["events"] = events
        except requests.exceptions.RequestException as e:
            result["stream_error"] = repr(e)  # cut without the chunked terminator
    return stream


def assert_shutting_down_end(result, srv, message_part):
    """The stream ended with a shutting_down error event naming `message_part`, then [DONE], and
    no earlier chunk finished its choice."""
    assert "events" in result, (result, srv.tail())
    ev = result["events"]
    assert ev[-1] == "[DONE]", ev[-3:]
    err = json.loads(ev[-2])["error"]
    assert err["code"] == "shutting_down", err
    assert err["type"] == "service_unavailable", err
    assert message_part in err["message"], err
    chunks = [json.loads(e) for e in ev[:-2]]
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks if c["choices"]), ev[-4:]
    return chunks


def test_sigterm_drains_running_streams():
    srv = Server(extra_args=["--shutdown-timeout", "60"])
    try:
        result = {}
        started = threading.Event()

        def stream():
            with requests.post(srv.base + "/v1/completions", headers=srv.headers(), stream=True, timeout=120,
                               json={"prompt": [5, 6, 7, 8], "max_tokens": 1500, "temperature": 0,
                                     "ignore_eos": True, "stream": True}) as r:
                events = []
                for l in r.iter_lines():
                    if l.startswith(b"data: "):
                        events.append(l.decode()[6:])
                        started.set()
            result["events"] = events

        t = threading.Thread(target=stream)
        t.start()
        # The stream is running (its first chunk arrived; a fixed sleep raced a loaded machine: a
        # signal before the request was admitted drains nothing and the server is gone at once).
        assert started.wait(timeout=60)
        srv.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        # Draining: new generation requests are refused with an OpenAI-style 503; health says so.
        r = requests.post(srv.base + "/v1/completions", headers=srv.headers(), timeout=30,
                          json={"prompt": [1, 2], "max_tokens": 2})
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "shutting_down"
        assert requests.get(srv.base + "/health", timeout=5).status_code == 503
        t.join(timeout=120)
        ev = result["events"]
        assert ev[-1] == "[DONE]"
        chunks = [json.loads(e) for e in ev[:-1]]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        n_text = sum(1 for c in chunks if c["choices"] and c["choices"][0].get("text"))
        assert n_text > 1000  # the stream ran to its end, not cut at the signal
        assert srv.proc.wait(timeout=60) == 0
    finally:
        srv.stop()


def test_sigterm_drain_waits_until_slow_readers_have_their_whole_stream():
    """A stream whose generation ends during the drain but whose client reads slower than it was
    produced gets every byte before the process exits (the drain waited only for the generation
    and then dropped the ~MBs still queued for the socket: a cut stream without [DONE], exit 0)."""
    import socket

    srv = Server(extra_args=["--shutdown-timeout", "60"])
    sock = None
    try:
        # n = 8 choices with 20 logprobs each: ~5 MB of events in a few hundred engine steps, more
        # than the kernel's socket buffers hold while this client does not read.
        body = json.dumps({"prompt": [5, 6, 7, 8], "max_tokens": 700, "n": 8, "logprobs": 20,
                           "temperature": 0, "ignore_eos": True, "stream": True}).encode()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", srv.port))
        head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Authorization: Bearer {srv.api_key}\r\nContent-Length: {len(body)}\r\n\r\n")
        sock.sendall(head.encode() + body)
        first = sock.recv(4096)  # the response head: the generation is running
        assert first.startswith(b"HTTP/1.1 200"), first[:200]
        srv.proc.send_signal(signal.SIGTERM)
        time.sleep(1)
        # Then read at ~0.8 MB/s, slower than the events are produced, so that MBs are still
        # queued in the server when the generation ends.
        data = first
        sock.settimeout(60)
        while True:
            d = sock.recv(16384)
            if not d:
                break
            data += d
            time.sleep(0.02)
        assert data.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"), (len(data), data[-80:], srv.tail())
        assert len(data) > 3_000_000, len(data)  # more than the socket buffers held
        assert srv.proc.wait(timeout=60) == 0
    finally:
        if sock:
            sock.close()
        srv.stop()


def test_second_signal_ends_open_streams_with_an_error_and_exits_nonzero():
    """A second SIGINT during the drain stops now, but not silently: every open stream gets an
    OpenAI-style error event (code "shutting_down") and [DONE], then a properly ended chunked
    response; a pending non-streaming request gets a 503 with the same code. The process logs
    "shutting down" and exits 128 + SIGINT = 130 (not killed by the signal's default action in a
    thread that does not block it, e.g. one a library started before `serve` blocked the stop
    signals)."""
    srv = Server(extra_args=["--shutdown-timeout", "60"])
    try:
        result = {}
        started = threading.Event()

        stream = long_stream(srv, 3000, result, started)

        def blocking():
            try:
                r = requests.post(srv.base + "/v1/completions", headers=srv.headers(), timeout=120,
                                  json={"prompt": [9, 10, 11], "max_tokens": 3000, "temperature": 0,
                                        "ignore_eos": True})
                result["blocking"] = (r.status_code, r.json())
            except (requests.exceptions.RequestException, ValueError) as e:
                result["blocking_error"] = repr(e)

        threads = [threading.Thread(target=stream), threading.Thread(target=blocking)]
        for t in threads:
            t.start()
        assert started.wait(timeout=60)  # the stream is running
        time.sleep(0.5)  # and the blocking request too
        srv.proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
        srv.proc.send_signal(signal.SIGINT)
        rc = srv.proc.wait(timeout=30)
        for t in threads:
            t.join(timeout=30)
        assert rc == 128 + signal.SIGINT, srv.tail()
        assert "shutting down" in srv.tail(), srv.tail()
        assert "ended with a shutting_down error" in srv.tail(), srv.tail()
        texts = assert_shutting_down_end(result, srv, "signal")
        assert any(c["choices"] and c["choices"][0].get("text") for c in texts), texts[:5]
        assert "blocking" in result, (result, srv.tail())
        status, body = result["blocking"]
        assert status == 503, body
        assert body["error"]["code"] == "shutting_down", body
    finally:
        srv.stop()


def test_second_sigterm_ends_the_drain_and_exits_143():
    """The same with SIGTERM: the second one stops now and the process exits 128 + SIGTERM."""
    srv = Server(extra_args=["--shutdown-timeout", "60"])
    try:
        started = threading.Event()

        def stream():
            try:
                with requests.post(srv.base + "/v1/completions", headers=srv.headers(), stream=True,
                                   timeout=120,
                                   json={"prompt": [5, 6, 7, 8], "max_tokens": 3000, "temperature": 0,
                                         "ignore_eos": True, "stream": True}) as r:
                    for _ in r.iter_lines():
                        started.set()
            except requests.exceptions.RequestException:
                pass

        t = threading.Thread(target=stream)
        t.start()
        assert started.wait(timeout=60)
        srv.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        srv.proc.send_signal(signal.SIGTERM)
        rc = srv.proc.wait(timeout=30)
        t.join(timeout=30)
        assert rc == 128 + signal.SIGTERM, srv.tail()
        assert "shutting down" in srv.tail(), srv.tail()
    finally:
        srv.stop()


def test_drain_timeout_ends_open_streams_with_an_error():
    """A stream still running when --shutdown-timeout expires is not cut silently: it ends like the
    other aborted streams, with an OpenAI-style error event (code "shutting_down", the message
    naming --shutdown-timeout), [DONE] and the chunked terminator; the process exits 0."""
    srv = Server(extra_args=["--shutdown-timeout", "1"])
    try:
        result = {}
        started = threading.Event()

        stream = long_stream(srv, 20000, result, started)

        t = threading.Thread(target=stream)
        t.start()
        assert started.wait(timeout=60)
        srv.proc.send_signal(signal.SIGTERM)
        rc = srv.proc.wait(timeout=30)
        t.join(timeout=30)
        assert rc == 0, srv.tail()
        assert "drain timed out" in srv.tail(), srv.tail()
        assert_shutting_down_end(result, srv, "--shutdown-timeout")
    finally:
        srv.stop()
