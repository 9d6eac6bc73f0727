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
