"""Multi-turn chat through the server with the prefix cache (ShadowRadix, on by default): turn
n+1 reports as `cached_tokens` every token the engine computed for turn n (its prompt plus every
generated token but the last, which was sampled and never fed back), and the answer equals the
one of a server with `--disable-prefix-cache` (greedy)."""
import openai

from conftest import Server


def conversation(client, model, turns=3, max_tokens=16):
    msgs, usages, answers = [], [], []
    for i in range(turns):
        msgs.append({"role": "user", "content": f"Question {i}: what is a list, a dict and a set?"})
        r = client.chat.completions.create(model=model, messages=msgs, max_tokens=max_tokens,
                                           temperature=0, extra_body={"ignore_eos": True})
        answers.append(r.choices[0].message.content)
        usages.append(r.usage)
        msgs.append({"role": "assistant", "content": r.choices[0].message.content})
    return usages, answers


def test_multi_turn_reports_previous_conversation_cached(client, model_name):
    usages, answers = conversation(client, model_name)
    for prev, cur in zip(usages, usages[1:]):
        computed = prev.prompt_tokens + prev.completion_tokens - 1
        assert cur.prompt_tokens_details.cached_tokens == computed, (prev, cur)
        assert cur.prompt_tokens > computed

    cold = Server(extra_args=["--disable-prefix-cache"])
    try:
        c2 = openai.OpenAI(base_url=cold.base + "/v1", api_key=cold.api_key)
        cold_usages, cold_answers = conversation(c2, model_name)
    finally:
        cold.stop()
    assert cold_answers == answers
    assert all(u.prompt_tokens_details.cached_tokens == 0 for u in cold_usages)


SYSTEMS = [f"System {s}: you are assistant number {s}. Answer about Python lists, dicts, sets, "
           f"tuples and strings, briefly and politely, in the style of manual {s * 11}." for s in range(4)]


def branch_workload(base, api_key, waves=4, questions=12):
    """Many branches off 4 shared system prompts; each wave asks new questions (more distinct
    boundaries than the prefix store keeps snapshots for, so old branches are evicted)."""
    import concurrent.futures as cf
    import requests

    def one(args):
        w, s, q = args
        body = {"model": "default", "max_tokens": 4, "temperature": 0, "ignore_eos": True,
                "messages": [{"role": "system", "content": SYSTEMS[s]},
                             {"role": "user", "content": f"Wave {w} question {q}: what is item {q}?"}]}
        r = requests.post(base + "/v1/chat/completions", json=body, timeout=120,
                          headers={"Authorization": f"Bearer {api_key}"})
        assert r.status_code == 200, r.text
        j = r.json()
        return (w, s, q), j["choices"][0]["message"]["content"], j["usage"]

    out, rates = {}, []
    for w in range(waves):
        jobs = [(w, s, q) for q in range(questions) for s in range(4)]
        with cf.ThreadPoolExecutor(8) as ex:
            res = list(ex.map(one, jobs))
        prompt = sum(u["prompt_tokens"] for _, _, u in res)
        cached = sum(u["prompt_tokens_details"]["cached_tokens"] for _, _, u in res)
        rates.append(cached / prompt)
        out.update({k: c for k, c, _ in res})
    return out, rates


def test_many_branch_shared_prefix_under_pressure():
    warm = Server()
    try:
        on, rates = branch_workload(warm.base, warm.api_key)
    finally:
        warm.stop()
    cold = Server(extra_args=["--disable-prefix-cache"])
    try:
        off, cold_rates = branch_workload(cold.base, cold.api_key)
    finally:
        cold.stop()
    assert on == off  # every output equals the cache-off server's (greedy)
    assert all(r == 0 for r in cold_rates)
    # Each system prompt is a branch point from the first wave on: every wave hits it (the shared
    # system prompt is most of every prompt), and the hit rate never falls as old branches are
    # evicted (48 new boundaries per wave > the 80 snapshots the default store keeps).
    assert all(r > 0.4 for r in rates), rates
    assert all(b >= a - 0.05 for a, b in zip(rates, rates[1:])), rates
