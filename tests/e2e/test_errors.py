"""Malformed requests against a real `v4serve serve`: each gets a 4xx with an OpenAI-style error
body (or a closed connection for a slow-loris client), and the server keeps serving everyone."""
import json
import socket
import threading
import time

import openai
import pytest
import requests

MSG = [{"role": "user", "content": "hi"}]


def check_error(r, status, param=None, code=None):
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert isinstance(err["message"], str) and err["message"]
    assert "type" in err and "param" in err and "code" in err
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    return err


def still_serving(server, client, model_name):
    r = client.completions.create(model=model_name, prompt="ok", max_tokens=2, temperature=0)
    assert r.usage.completion_tokens >= 1


@pytest.mark.parametrize("body,param", [
    ({"messages": MSG, "max_tokens": -1}, "max_tokens"),
    ({"messages": MSG, "max_tokens": 0}, "max_tokens"),
    ({"messages": MSG, "max_tokens": 10 ** 12}, "max_tokens"),
    ({"messages": MSG, "max_tokens": "ten"}, "max_tokens"),
    ({"messages": MSG, "temperature": "hot"}, "temperature"),
    ({"messages": MSG, "temperature": -1}, "temperature"),
    ({"messages": MSG, "top_p": 5}, "top_p"),
    ({"messages": MSG, "n": "2"}, "n"),
    ({"messages": MSG, "stream": "yes"}, "stream"),
    ({"messages": MSG, "stop": 7}, "stop"),
    ({"messages": MSG, "logprobs": True, "top_logprobs": 99}, "top_logprobs"),
    ({"messages": "hello"}, "messages"),
    ({"messages": []}, "messages"),
    ({}, "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages"),
    ({"messages": [{"role": "user", "content": 12}]}, "messages"),
    ({"messages": MSG, "tools": "nope"}, "tools"),
    # OpenAI's checks: duplicate tool names, `properties` / a json_schema `schema` that is not an
    # object, null content on a user or system message.
    ({"messages": MSG, "tools": [{"type": "function", "function": {"name": "f"}}] * 2}, "tools"),
    ({"messages": MSG, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": "city"}}}]}, "tools"),
    ({"messages": MSG, "response_format": {"type": "json_schema",
                                           "json_schema": {"name": "x", "schema": [1]}}},
     "response_format"),
    ({"messages": [{"role": "user", "content": None}]}, "messages"),
    ({"messages": [{"role": "system", "content": None}] + MSG}, "messages"),
    ({"messages": MSG, "stop": [1, 2]}, "stop"),
    # An assistant message without content or tool_calls; a property schema that is not an
    # object; integers written as decimal numbers.
    ({"messages": MSG + [{"role": "assistant", "content": None}] + MSG}, "messages"),
    ({"messages": MSG, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"x": 5}}}}]}, "tools"),
    ({"messages": MSG, "max_tokens": 1.0}, "max_tokens"),
    ({"messages": MSG, "n": 1e2}, "n"),
])
def test_bad_chat_fields(server, body, param):
    check_error(server.post("/v1/chat/completions", json=body), 400, param=param)


def test_bad_json_and_types(server, client, model_name):
    check_error(server.post("/v1/chat/completions", data=b"{not json",
                            headers={"Content-Type": "application/json"}), 400)
    check_error(server.post("/v1/chat/completions", data=b"[1, 2]"), 400)
    check_error(server.post("/v1/chat/completions", data=b""), 400)
    check_error(server.post("/v1/completions", json={"prompt": {"a": 1}}), 400, param="prompt")
    check_error(server.post("/v1/completions", json={"prompt": [1, -5]}), 400, param="prompt")
    check_error(server.post("/v1/completions", json={"prompt": [10 ** 9]}), 400, param="prompt")
    still_serving(server, client, model_name)


def test_invalid_utf8(server, client, model_name):
    raw = b'{"messages": [{"role": "user", "content": "bad \xff\xfe bytes"}]}'
    err = check_error(server.post("/v1/chat/completions", data=raw,
                                  headers={"Content-Type": "application/json"}), 400)
    assert "UTF-8" in err["message"]
    still_serving(server, client, model_name)


def test_unknown_model(server, client):
    check_error(server.post("/v1/chat/completions", json={"model": "gpt-17", "messages": MSG}), 404,
                param="model", code="model_not_found")
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-17", messages=MSG)


def test_prompt_longer_than_context(server, client, model_name):
    ctx = server.post("/tokenize", json={"prompt": "x"}).json()["max_model_len"]
    long_ids = [5] * (ctx + 10)
    check_error(server.post("/v1/completions", json={"prompt": long_ids}), 400, code="context_length_exceeded")
    check_error(server.post("/v1/completions", json={"prompt": [5, 6], "max_tokens": ctx}), 400,
                code="context_length_exceeded")
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model_name, prompt=long_ids, max_tokens=4)
    still_serving(server, client, model_name)


def test_routes_methods_and_auth(server, client, model_name):
    check_error(requests.get(server.base + "/v1/nothing", headers=server.headers(), timeout=10), 404)
    check_error(requests.get(server.base + "/v1/chat/completions", headers=server.headers(), timeout=10), 405)
    check_error(requests.put(server.base + "/v1/models", headers=server.headers(), timeout=10), 405)
    # API key
    check_error(requests.post(server.base + "/v1/chat/completions", json={"messages": MSG}, timeout=10), 401,
                code="invalid_api_key")
    check_error(requests.post(server.base + "/v1/chat/completions", json={"messages": MSG}, timeout=10,
                              headers={"Authorization": "Bearer wrong"}), 401)
    bad = openai.OpenAI(base_url=server.base + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    # health and metrics stay open
    assert requests.get(server.base + "/health", timeout=5).status_code == 200
    assert "v4serve_http_requests_total" in requests.get(server.base + "/metrics", timeout=5).text
    still_serving(server, client, model_name)


def test_oversize_body_413(server, client, model_name):
    big = json.dumps({"messages": [{"role": "user", "content": "a" * (2 << 20)}]})
    try:
        r = server.post("/v1/chat/completions", data=big, headers={"Content-Type": "application/json"})
        check_error(r, 413, code="request_too_large")
    except requests.ConnectionError:
        pytest.fail("server reset the connection instead of answering 413")
    still_serving(server, client, model_name)


def test_slow_loris_is_closed(server, client, model_name):
    """A client sending its request head one byte every 0.3 s is closed by the header timeout (2 s
    here), while a normal client is served meanwhile."""
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {server.api_key}\r\n"
            "X-Padding: " + "a" * 60 + "\r\nContent-Length: 2\r\n\r\n{}").encode()
    s = socket.create_connection(("127.0.0.1", server.port))
    s.settimeout(10)
    closed_at = None
    t0 = time.time()
    served = {}

    def normal():
        served["ok"] = client.completions.create(model=model_name, prompt="hi", max_tokens=2).usage.completion_tokens

    th = threading.Thread(target=normal)
    th.start()
    try:
        for b in head:
            s.sendall(bytes([b]))
            time.sleep(0.3)
            if time.time() - t0 > 15:
                break
    except (BrokenPipeError, ConnectionResetError):
        closed_at = time.time() - t0
    if closed_at is None:
        try:
            data = s.recv(4096)
            if data == b"":
                closed_at = time.time() - t0
            else:
                pytest.fail(f"slow client got an answer: {data[:80]!r}")
        except (ConnectionResetError, socket.timeout):
            closed_at = time.time() - t0
    s.close()
    th.join(60)
    assert served.get("ok", 0) >= 1
    assert closed_at is not None and closed_at < 8, closed_at
    still_serving(server, client, model_name)


def test_disconnect_mid_stream_cancels(server, client, model_name):
    before = server.metrics().get("v4serve_engine_requests_aborted_total", 0)
    stream = client.completions.create(model=model_name, prompt="a long story", max_tokens=400,
                                       temperature=0, stream=True, extra_body={"ignore_eos": True})
    for i, _ in enumerate(stream):
        if i >= 2:
            break
    stream.close()
    deadline = time.time() + 30
    while time.time() < deadline:
        m = server.metrics()
        if m.get("v4serve_engine_requests_aborted_total", 0) > before and m.get("v4serve_num_requests_running", 1) == 0:
            break
        time.sleep(0.1)
    m = server.metrics()
    assert m.get("v4serve_engine_requests_aborted_total", 0) > before
    assert m.get("v4serve_num_requests_running") == 0
    still_serving(server, client, model_name)


def test_large_bodies_do_not_stall_other_clients():
    """Two concurrent ~20 MB text prompts (parsed and tokenized for seconds, then refused as too
    long) must not stall /health: requests used to be handled on the HTTP I/O threads, so two
    such uploads blocked every other client (health probes took as long as the uploads)."""
    from conftest import Server

    server = Server()  # the default 32 MiB body limit (the session server's is 1 MiB)
    try:
        big = json.dumps({"prompt": "hello world " * 1_700_000, "max_tokens": 1}).encode()
        done = []

        def upload():
            t0 = time.time()
            r = requests.post(server.base + "/v1/completions", data=big, timeout=300,
                              headers={**server.headers(), "Content-Type": "application/json"})
            done.append((r.status_code, time.time() - t0))

        threads = [threading.Thread(target=upload) for _ in range(2)]
        for t in threads:
            t.start()
        time.sleep(0.3)  # the uploads are being handled
        worst = 0.0
        while any(t.is_alive() for t in threads):
            t0 = time.time()
            assert requests.get(server.base + "/health", timeout=60).status_code == 200
            worst = max(worst, time.time() - t0)
            time.sleep(0.1)
        for t in threads:
            t.join()
        assert [s for s, _ in done] == [400, 400], done
        slowest = max(d for _, d in done)
        assert slowest > 1.0, done  # the uploads really kept a thread busy for a while
        assert worst < 0.5 * slowest, (worst, done)
    finally:
        server.stop()


def test_type_errors_say_what_they_got(server):
    err = check_error(server.post("/v1/chat/completions", json={"messages": MSG, "stop": [1, 2]}),
                      400, param="stop")
    assert "got integer" in err["message"], err


def test_unknown_fields_are_accepted_with_a_warning(server, client, model_name):
    """As vLLM: extra fields do not fail the request (OpenAI would answer 400); the server logs
    one warning per request naming them."""
    r = server.post("/v1/completions", json={"model": model_name, "prompt": "hi", "max_tokens": 2,
                                             "frobnicate_e2e": 1, "temprature": 0.5})
    assert r.status_code == 200, r.text
    lines = server.log_lines_with("frobnicate_e2e")
    assert len(lines) == 1, lines
    assert "unknown request field(s): frobnicate_e2e, temprature" in lines[0], lines
    assert "warn" in lines[0].lower(), lines


def test_objects_with_too_many_keys_are_refused(server, client, model_name):
    """One JSON object of many keys was parsed in quadratic time (ordered_json inserts by a linear
    search: 120k keys took ~40 s); past 8,192 keys in one object the body is a quick 400, on every
    endpoint that parses a body; 100 keys still work."""
    big = {f"k{i}": 1 for i in range(8193)}
    for path, body in [("/v1/chat/completions", {"messages": MSG, "max_tokens": 1, "x": big}),
                       ("/v1/completions", {**big, "prompt": "hi"}),
                       ("/tokenize", {"prompt": "hi", "x": big})]:
        t0 = time.time()
        err = check_error(server.post(path, json=body), 400)
        assert time.time() - t0 < 10.0  # refused before the DOM parse (a sanitizer build is slower)
        assert "8192 keys" in err["message"], err
        assert err["type"] == "invalid_request_error", err
    small = {f"k{i}": 1 for i in range(100)}
    r = server.post("/v1/chat/completions", json={"model": model_name, "messages": MSG,
                                                  "max_tokens": 1, "metadata_x": small})
    assert r.status_code == 200, r.text
    still_serving(server, client, model_name)


def test_unknown_field_names_cannot_forge_log_lines(server, client, model_name):
    """A field name with a newline / ANSI escape is logged escaped, on the warning's own line."""
    r = server.post("/v1/completions", json={"model": model_name, "prompt": "hi", "max_tokens": 1,
                                             "x\n2026 [error] FAKE_E2E\x1b[31m": 1})
    assert r.status_code == 200, r.text
    lines = server.log_lines_with("FAKE_E2E")
    assert len(lines) == 1, lines
    assert "unknown request field(s): x\\n2026 [error] FAKE_E2E\\u001b[31m" in lines[0], lines
    assert "\x1b" not in lines[0], lines


def test_error_messages_cannot_forge_access_log_lines(server, client, model_name):
    """The access log's `error="…"` quotes the error message, which often repeats the client's
    text (an unknown model name, a role, an effort value): it is logged escaped, on the request's
    own line. Before, `"model": "x\\n[… ] [info] FORGED…"` wrote a second, forged log line and raw
    ANSI escapes."""
    for path, body in [
        ("/v1/completions", {"model": "x\n2026 [info] FORGED_MODEL\x1b[31m\u2028", "prompt": "hi"}),
        ("/v1/chat/completions", {"model": model_name, "reasoning_effort": "hi\r\n[info] FORGED_EFFORT\x1b]0;t\x07",
                                  "messages": [{"role": "user", "content": "x"}]}),
    ]:
        r = server.post(path, json=body)
        assert r.status_code in (400, 404), r.text
    for tag in ("FORGED_MODEL", "FORGED_EFFORT"):
        lines = server.log_lines_with(tag)
        assert len(lines) == 1, lines
        assert lines[0].startswith("["), lines  # the access-log line itself, not a forged one
        assert '" 40' in lines[0], lines
        for raw in ("\x1b", "\x07", "\u2028", "\r"):
            assert raw not in lines[0], lines
    assert "\\n2026 [info] FORGED_MODEL\\u001b[31m\\u2028" in server.log_lines_with("FORGED_MODEL")[0]
