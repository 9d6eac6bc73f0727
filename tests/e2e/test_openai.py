"""End to end with the official `openai` client against a real `v4serve serve` (embedded model):
chat and completions, streaming and not, stop strings, logprobs, usage, a tool-call round trip,
64 concurrent streams (greedy equality, half cancelled, pools back to idle)."""
import concurrent.futures as cf
import json
import time

import openai
import pytest
import requests

PROMPTS = [f"Story {i}: once upon a time, number {i * 7 % 13} said" for i in range(64)]


def chat(client, model, content, **kw):
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 16)
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": content}], **kw)


def test_models_and_health(server, client, model_name):
    assert model_name
    assert requests.get(server.base + "/health", timeout=5).status_code == 200
    m = client.models.retrieve(model_name)
    assert m.id == model_name


def test_chat_non_streaming_usage(client, model_name):
    r = chat(client, model_name, "Hello there", max_tokens=12, extra_body={"ignore_eos": True})
    c = r.choices[0]
    assert c.message.role == "assistant"
    assert c.finish_reason == "length"
    assert r.usage.completion_tokens == 12
    assert r.usage.prompt_tokens > 3
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.prompt_tokens_details is not None
    assert r.usage.prompt_tokens_details.cached_tokens >= 0
    assert isinstance(c.message.content, str)


def test_chat_streaming_equals_non_streaming(client, model_name):
    kw = dict(max_tokens=20, extra_body={"ignore_eos": True})
    full = chat(client, model_name, "Tell me about the sea", **kw)
    stream = chat(client, model_name, "Tell me about the sea", stream=True,
                  stream_options={"include_usage": True}, **kw)
    content, reasoning, finish, usage, roles = "", "", None, None, []
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            if ch.delta.role:
                roles.append(ch.delta.role)
            content += ch.delta.content or ""
            reasoning += getattr(ch.delta, "reasoning_content", None) or ""
            if ch.finish_reason:
                finish = ch.finish_reason
    assert roles == ["assistant"]
    assert content == (full.choices[0].message.content or "")
    assert finish == "length"
    assert usage is not None and usage.completion_tokens == 20
    assert usage.prompt_tokens == full.usage.prompt_tokens


def test_thinking_switch_gives_reasoning(client, model_name):
    r = chat(client, model_name, "Think about cats", max_tokens=8,
             extra_body={"ignore_eos": True, "chat_template_kwargs": {"thinking": True}})
    msg = r.choices[0].message
    # In thinking mode the output starts inside <think>: the tiny model rarely closes it, so the
    # text lands in reasoning_content (and the prompt is longer by the effort/think markers).
    assert (getattr(msg, "reasoning_content", None) or "") + (msg.content or "") != ""
    plain = chat(client, model_name, "Think about cats", max_tokens=8, extra_body={"ignore_eos": True})
    assert r.usage.prompt_tokens >= plain.usage.prompt_tokens


def test_reasoning_effort_reaches_the_encoder(server, model_name):
    msgs = [{"role": "user", "content": "Think about cats"}]

    def count(**kw):
        t = server.post("/tokenize", json={"model": model_name, "messages": msgs, **kw})
        assert t.status_code == 200, t.text
        return t.json()["count"]

    chat_mode = count()
    thinking = count(chat_template_kwargs={"thinking": True})
    effort_max = count(reasoning_effort="max")  # implies thinking; adds the effort prefix
    assert effort_max > thinking >= chat_mode
    assert count(reasoning_effort="max", chat_template_kwargs={"thinking": False}) == chat_mode
    bad = server.post("/v1/chat/completions", json={"messages": msgs, "reasoning_effort": "ultra"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "reasoning_effort"


def test_completions_streaming_and_not(client, model_name):
    kw = dict(model=model_name, prompt="The quick brown fox", max_tokens=16, temperature=0,
              extra_body={"ignore_eos": True})
    full = client.completions.create(**kw)
    assert full.choices[0].finish_reason == "length"
    assert full.usage.completion_tokens == 16
    text = ""
    usage = None
    for chunk in client.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            text += ch.text
    assert text == full.choices[0].text
    assert usage.completion_tokens == 16
    # echo
    e = client.completions.create(echo=True, **kw)
    assert e.choices[0].text == "The quick brown fox" + full.choices[0].text


def test_stop_strings(client, model_name):
    base = client.completions.create(model=model_name, prompt="Once upon a time", max_tokens=40,
                                     temperature=0, extra_body={"ignore_eos": True})
    text = base.choices[0].text
    assert len(text) >= 6, text
    mid = len(text) // 2
    stop = text[mid:mid + 2]
    expect = text[: text.index(stop)]
    for stream in (False, True):
        kw = dict(model=model_name, prompt="Once upon a time", max_tokens=40, temperature=0,
                  stop=[stop, "\x00never"], extra_body={"ignore_eos": True})
        if stream:
            got, finish = "", None
            for chunk in client.completions.create(stream=True, **kw):
                for ch in chunk.choices:
                    got += ch.text
                    finish = ch.finish_reason or finish
        else:
            r = client.completions.create(**kw)
            got, finish = r.choices[0].text, r.choices[0].finish_reason
        assert got == expect, (stream, stop, got, text)
        assert finish == "stop"
    # Chat with a single stop string.
    full = chat(client, model_name, "Say something", max_tokens=30, extra_body={"ignore_eos": True})
    content = full.choices[0].message.content or ""
    if len(content) >= 4:
        s = content[len(content) // 2:len(content) // 2 + 1]
        r = chat(client, model_name, "Say something", max_tokens=30, stop=s, extra_body={"ignore_eos": True})
        assert r.choices[0].message.content == content[: content.index(s)]
        assert r.choices[0].finish_reason == "stop"


def test_logprobs(client, model_name):
    r = chat(client, model_name, "Numbers:", max_tokens=6, logprobs=True, top_logprobs=3,
             extra_body={"ignore_eos": True})
    items = r.choices[0].logprobs.content
    assert len(items) == 6
    for it in items:
        assert it.logprob <= 0
        assert len(it.top_logprobs) == 3
        # greedy: the chosen token is the most likely one
        assert abs(max(t.logprob for t in it.top_logprobs) - it.logprob) < 1e-4
        assert isinstance(it.bytes, list)
    c = client.completions.create(model=model_name, prompt="Numbers:", max_tokens=5, temperature=0,
                                  logprobs=2, extra_body={"ignore_eos": True})
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == 5 and len(lp.token_logprobs) == 5 and len(lp.text_offset) == 5
    assert all(v <= 0 for v in lp.token_logprobs)
    assert all(1 <= len(t) <= 2 for t in lp.top_logprobs)


def test_sampling_params_accepted(client, model_name):
    r = chat(client, model_name, "Hi", max_tokens=5, temperature=0.8, top_p=0.9, seed=7, n=2,
             presence_penalty=0.5, frequency_penalty=0.5,
             extra_body={"top_k": 20, "min_p": 0.05, "ignore_eos": True})
    assert len(r.choices) == 2
    assert r.usage.completion_tokens == 10
    r2 = chat(client, model_name, "Hi", max_tokens=5, temperature=0.8, top_p=0.9, seed=7, n=2,
              presence_penalty=0.5, frequency_penalty=0.5,
              extra_body={"top_k": 20, "min_p": 0.05, "ignore_eos": True})
    # seeded sampling is reproducible
    assert [c.message.content for c in r.choices] == [c.message.content for c in r2.choices]


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def test_tool_call_round_trip(server, client, model_name):
    messages = [
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 22C"},
    ]
    r = client.chat.completions.create(model=model_name, messages=messages, tools=TOOLS, max_tokens=8,
                                       temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # The encoding path: the prompt the server built holds the DSML call and the tool result.
    t = server.post("/tokenize", json={"model": model_name, "messages": messages, "tools": TOOLS})
    assert t.status_code == 200, t.text
    assert t.json()["count"] == r.usage.prompt_tokens
    d = server.post("/detokenize", json={"tokens": t.json()["tokens"]})
    prompt = d.json()["prompt"]
    assert '<｜DSML｜invoke name="get_weather">' in prompt
    assert '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>' in prompt
    assert "<tool_result>sunny, 22C</tool_result>" in prompt
    assert "## Tools" in prompt and '"name": "get_weather"' in prompt
    # tool_choice none drops the tool block; a named choice must exist.
    bad = server.post("/v1/chat/completions", json={
        "messages": messages, "tools": TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "nope"}}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tool_choice"


def test_tokenize_detokenize(server, model_name):
    t = server.post("/tokenize", json={"model": model_name, "prompt": "hello world"})
    assert t.status_code == 200
    j = t.json()
    assert j["count"] == len(j["tokens"]) > 0 and j["max_model_len"] > 0
    d = server.post("/detokenize", json={"model": model_name, "tokens": j["tokens"]})
    assert d.json()["prompt"].endswith("hello world")
    # Text prompts start with BOS (as `v4serve generate --prompt`), unless add_special_tokens is false.
    raw = server.post("/tokenize", json={"model": model_name, "prompt": "hello world",
                                         "add_special_tokens": False}).json()
    assert j["tokens"][1:] == raw["tokens"] and j["tokens"][0] != raw["tokens"][0]
    assert server.post("/detokenize", json={"tokens": j["tokens"][:1]}).json()["prompt"] == "<｜begin▁of▁sentence｜>"


def _stream_completion(client, model, prompt, max_tokens, cancel_after=None):
    stream = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True})
    text, n = "", 0
    for chunk in stream:
        for ch in chunk.choices:
            text += ch.text
        n += 1
        if cancel_after is not None and n >= cancel_after:
            stream.close()  # hang up mid-stream
            return None
    return text


def _pool_used(server):
    m = server.metrics()
    return {k: v for k, v in m.items() if k.startswith("v4serve_cache_used_pages")}, m


def _wait_idle(server, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        pools, m = _pool_used(server)
        if m.get("v4serve_num_requests_running", 1) == 0 and m.get("v4serve_num_requests_waiting", 1) == 0:
            return pools
        time.sleep(0.2)
    raise AssertionError("server did not become idle")


def test_64_concurrent_streams_greedy_and_cancel_half(server, client, model_name):
    max_tokens = 12
    idle = _wait_idle(server)
    solo = [client.completions.create(model=model_name, prompt=p, max_tokens=max_tokens, temperature=0,
                                      extra_body={"ignore_eos": True}).choices[0].text for p in PROMPTS]
    assert len(set(solo)) > 1, "different prompts should give different outputs"

    with cf.ThreadPoolExecutor(64) as ex:
        got = list(ex.map(lambda p: _stream_completion(client, model_name, p, max_tokens), PROMPTS))
    for i, (a, b) in enumerate(zip(got, solo)):
        assert a == b, f"client {i}: concurrent {a!r} != alone {b!r}"

    # Now cancel every odd client after 2 chunks; the even ones must still be exact.
    long_tokens = 40
    solo_long = {i: client.completions.create(model=model_name, prompt=PROMPTS[i], max_tokens=long_tokens,
                                              temperature=0, extra_body={"ignore_eos": True}).choices[0].text
                 for i in range(0, 64, 2)}
    aborted_before = server.metrics().get("v4serve_engine_requests_aborted_total", 0)
    with cf.ThreadPoolExecutor(64) as ex:
        futs = {i: ex.submit(_stream_completion, client, model_name, PROMPTS[i], long_tokens,
                             2 if i % 2 else None) for i in range(64)}
        res = {i: f.result() for i, f in futs.items()}
    for i in range(0, 64, 2):
        assert res[i] == solo_long[i], f"client {i} changed after others cancelled"
    after = _wait_idle(server)
    m = server.metrics()
    # (a request that finished before its client hung up is not aborted; most are)
    assert m.get("v4serve_engine_requests_aborted_total", 0) - aborted_before >= 8
    # Pool usage is back to its idle level (nothing leaked by the cancelled requests).
    for k, v in after.items():
        assert v <= idle.get(k, 0), f"{k}: {v} pages in use after idle, {idle.get(k)} before"


def test_tool_choice_named_and_required(server, client, model_name):
    messages = [{"role": "user", "content": "What's the weather in Paris?"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    # A named function is pre-filled in the prompt: the reply is a call to it, whatever the model.
    for thinking in (False, True):
        r = client.chat.completions.create(model=model_name, messages=messages, tools=TOOLS, tool_choice=named,
                                           max_tokens=12, temperature=0,
                                           extra_body={"chat_template_kwargs": {"thinking": thinking}})
        calls = r.choices[0].message.tool_calls
        assert calls and calls[0].function.name == "get_weather", r
        assert r.choices[0].finish_reason in ("tool_calls", "length"), r
        # Prose the (dummy) model writes where the parameters belong is returned as content, never
        # dropped; the call keeps only the arguments written ("" when cut before any parameter).
        # Streaming gives the same content and arguments.
        stream = client.chat.completions.create(model=model_name, messages=messages, tools=TOOLS,
                                                tool_choice=named, max_tokens=12, temperature=0, stream=True,
                                                extra_body={"chat_template_kwargs": {"thinking": thinking}})
        chunks = [c for ch in stream for c in ch.choices]
        names = [tc.function.name for c in chunks for tc in (c.delta.tool_calls or [])
                 if tc.function and tc.function.name]
        assert names == ["get_weather"], names
        streamed = "".join(c.delta.content or "" for c in chunks)
        assert streamed == (r.choices[0].message.content or ""), (streamed, r)
        args = "".join(tc.function.arguments or "" for c in chunks for tc in (c.delta.tool_calls or [])
                       if tc.function)
        assert args == (calls[0].function.arguments or ""), (args, r)
    # The prompt ends with the pre-filled openers (what /tokenize shows).
    for choice, tail in ((named, '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n'),
                         ("required", "</think>\n\n<｜DSML｜tool_calls>\n")):
        t = server.post("/tokenize", json={"model": model_name, "messages": messages, "tools": TOOLS,
                                           "tool_choice": choice})
        assert t.status_code == 200, t.text
        prompt = server.post("/detokenize", json={"tokens": t.json()["tokens"]}).json()["prompt"]
        assert prompt.endswith(tail), prompt[-200:]
    # "required" or a named function without tools: 400 on tool_choice.
    for choice in ("required", named):
        bad = server.post("/v1/chat/completions", json={"messages": messages, "tool_choice": choice})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "tool_choice", bad.text


def _completion_text(client, stream, **kw):
    if not stream:
        r = client.completions.create(**kw)
        return r.choices[0].text, r.choices[0].logprobs
    text, toks = "", []
    for chunk in client.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            text += ch.text
            if ch.logprobs is not None:
                toks += ch.logprobs.tokens
    return text, toks


def test_completions_skip_special_tokens(client, model_name):
    """skip_special_tokens (default true, as vLLM) hides the template control tokens chat never
    shows (`<｜User｜>`, ...) and the tokenizer's special tokens from /v1/completions text,
    streaming or not; false keeps them. `</think>` stays (it delimits reasoning in the raw text).
    logprobs list every generated token either way (as vLLM)."""
    user = "<｜User｜>"
    kw = dict(model=model_name, prompt="Hi", max_tokens=3, temperature=0, logprobs=0)
    for stream in (False, True):
        text, lp = _completion_text(client, stream, extra_body={"ignore_eos": True, "logit_bias": {"6": 100}}, **kw)
        assert text == "", (stream, text)
        toks = lp if stream else lp.tokens
        assert toks == [user] * 3, (stream, toks)
        text, _ = _completion_text(client, stream, extra_body={"ignore_eos": True, "logit_bias": {"6": 100},
                                                               "skip_special_tokens": False}, **kw)
        assert text == user * 3, (stream, text)
        text, _ = _completion_text(client, stream, extra_body={"ignore_eos": True, "logit_bias": {"25": 100},
                                                               "spaces_between_special_tokens": True}, **kw)
        assert text == "</think>" * 3, (stream, text)


def test_echo_logprob_tokens_join_to_the_text(client, model_name):
    """echo + logprobs: the listed tokens concatenate to the returned text — the BOS the server
    puts in front of a text prompt is in neither; the first listed token is scored given it."""
    prompt = "The quick brown fox"
    for stream in (False, True):
        for max_tokens in (0, 4):
            kw = dict(model=model_name, prompt=prompt, max_tokens=max_tokens, temperature=0, echo=True,
                      logprobs=1, extra_body={"ignore_eos": True, "logit_bias": {"1": -100}})
            text, lp = _completion_text(client, stream, **kw)
            toks = lp if stream else lp.tokens
            assert text.startswith(prompt), text
            assert "".join(toks) == text, (stream, max_tokens, toks, text)
            if not stream:
                assert lp.token_logprobs[0] is not None and lp.token_logprobs[0] <= 0, lp
                assert lp.text_offset[0] == 0 and len(lp.text_offset) == len(toks), lp


def test_sync_outputs_give_the_same_streams(server, client, model_name):
    """--sync-outputs (callbacks on the scheduler thread between steps) and the default output
    thread give the same streamed text, finish reasons and usage — also when a stop string ends
    the stream (the output thread sees it a step or two after the engine made it; the extra
    tokens are not sent)."""
    from conftest import Server
    import openai as oa

    def streams(c, stop_for):
        out = []
        def one(i):
            kw = {"stop": stop_for[i]} if stop_for else {}
            s = c.completions.create(model=model_name, prompt=PROMPTS[i], max_tokens=24, temperature=0,
                                     stream=True, stream_options={"include_usage": True},
                                     extra_body={"ignore_eos": True}, **kw)
            text, finish, usage = "", None, None
            for ch in s:
                if ch.choices:
                    text += ch.choices[0].text
                    finish = ch.choices[0].finish_reason or finish
                if ch.usage:
                    usage = (ch.usage.prompt_tokens, ch.usage.completion_tokens)
            return text, finish, usage
        with cf.ThreadPoolExecutor(8) as ex:
            out = list(ex.map(one, range(8)))
        return out

    other = Server(extra_args=["--sync-outputs", "--context-length", "8192"])
    try:
        c2 = oa.OpenAI(base_url=other.base + "/v1", api_key=other.api_key, max_retries=0, timeout=300)
        base = streams(client, None)
        assert base == streams(c2, None)
        # A stop string from the middle of each text: the stream ends before it, "stop".
        stops = [t[len(t) // 2:len(t) // 2 + 3] or "\x00" for t, _, _ in base]
        a, b = streams(client, stops), streams(c2, stops)
        assert a == b
        assert any(f == "stop" for _, f, _ in a), a
    finally:
        other.stop()
