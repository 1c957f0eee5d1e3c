"""Chat and completions through the official openai SDK and raw HTTP."""
import json

import openai
import requests


def client(server, **kw):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", **kw)


def test_models_health_version(tiny):
    r = requests.get(tiny.url + "/v1/models")
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "list"
    m = body["data"][0]
    assert m["id"] == "tiny" and m["object"] == "model" and m["max_model_len"] == 512
    models = client(tiny).models.list()
    assert [x.id for x in models.data] == ["tiny"]
    assert requests.get(tiny.url + "/health").status_code == 200
    assert "version" in requests.get(tiny.url + "/version").json()


def test_chat_completion_shape(tiny):
    c = client(tiny)
    r = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hello world!"}], max_tokens=8, temperature=0)
    assert r.id.startswith("chatcmpl-")
    assert r.object == "chat.completion"
    assert r.model == "tiny"
    assert isinstance(r.created, int)
    ch = r.choices[0]
    assert ch.index == 0 and ch.message.role == "assistant"
    assert ch.finish_reason in ("stop", "length")
    assert isinstance(ch.message.content, str)
    assert r.usage.completion_tokens <= 8 and r.usage.completion_tokens >= 1
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    # greedy is deterministic
    r2 = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hello world!"}], max_tokens=8, temperature=0)
    assert r2.choices[0].message.content == ch.message.content


def test_chat_content_parts_and_max_completion_tokens(tiny):
    body = {"model": "tiny", "messages": [{"role": "system", "content": "Be brief."},
                                          {"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "world"}]}],
            "max_completion_tokens": 3, "max_tokens": 50, "temperature": 0, "ignore_eos": True, "some_unknown_field": {"x": 1}}
    r = requests.post(tiny.url + "/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    j = r.json()
    assert j["usage"]["completion_tokens"] == 3
    assert j["choices"][0]["finish_reason"] == "length"


def test_prompt_matches_reference_rendering(tiny):
    """Every reference_chat.json case through HTTP: the prompt token count equals transformers'."""
    cases = json.loads((tiny_path() / "reference_chat.json").read_text())["cases"]
    for case in cases:
        if not case["add_generation_prompt"]:
            continue
        msgs = []
        for m in case["messages"]:
            m = dict(m)
            if "tool_calls" in m:  # clients send arguments as JSON strings
                m["tool_calls"] = [dict(tc, id=f"call_{i}", function=dict(tc["function"], arguments=json.dumps(tc["function"]["arguments"])))
                                   for i, tc in enumerate(m["tool_calls"])]
            msgs.append(m)
        body = {"model": "tiny", "messages": msgs, "max_tokens": 1, "temperature": 0,
                "chat_template_kwargs": {"enable_thinking": case["enable_thinking"]}}
        if case["tools"]:
            body["tools"] = case["tools"]
        r = requests.post(tiny.url + "/v1/chat/completions", json=body)
        assert r.status_code == 200, (case["name"], r.text)
        assert r.json()["usage"]["prompt_tokens"] == len(case["token_ids"]), case["name"]


def tiny_path():
    from conftest import TINY_CHAT
    return TINY_CHAT


def test_completions_text_list_and_ids(tiny):
    c = client(tiny)
    r = c.completions.create(model="tiny", prompt="The quick brown fox", max_tokens=5, temperature=0)
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    assert len(r.choices) == 1 and isinstance(r.choices[0].text, str)
    assert r.choices[0].finish_reason in ("stop", "length")
    r2 = c.completions.create(model="tiny", prompt=["The quick brown fox", "Hello world"], max_tokens=5, temperature=0)
    assert [ch.index for ch in r2.choices] == [0, 1]
    assert r2.choices[0].text == r.choices[0].text
    ids = requests.post(tiny.url + "/v1/completions", json={"prompt": [2, 40, 41, 42], "max_tokens": 4, "temperature": 0, "ignore_eos": True}).json()
    cached = ids["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert 0 <= cached < 4
    assert ids["usage"] == {"prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8, "prompt_tokens_details": {"cached_tokens": cached}}
    # default max_tokens is 16 as in vLLM
    d = requests.post(tiny.url + "/v1/completions", json={"prompt": "Hello", "temperature": 0, "ignore_eos": True}).json()
    assert d["usage"]["completion_tokens"] == 16


def test_logprobs(tiny):
    c = client(tiny)
    r = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0,
                                  logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs.content
    assert len(lp) == 4
    for e in lp:
        assert e.logprob <= 0 and len(e.top_logprobs) == 3
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob
        assert abs(e.top_logprobs[0].logprob - e.logprob) < 1e-5  # greedy picks the best
    r = requests.post(tiny.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 3, "temperature": 0, "logprobs": 2, "ignore_eos": True}).json()
    l = r["choices"][0]["logprobs"]
    assert len(l["tokens"]) == 3 and len(l["token_logprobs"]) == 3 and len(l["top_logprobs"][0]) == 2


def test_stop_strings_and_seed(tiny):
    c = client(tiny)
    base = c.completions.create(model="tiny", prompt="Hello", max_tokens=12, temperature=0, extra_body={"ignore_eos": True}).choices[0].text
    assert len(base) > 3
    stop = base[2:4]
    r = c.completions.create(model="tiny", prompt="Hello", max_tokens=12, temperature=0, stop=[stop], extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == base[: base.index(stop)]
    a = c.completions.create(model="tiny", prompt="Hello", max_tokens=10, temperature=1.0, seed=1234).choices[0].text
    b = c.completions.create(model="tiny", prompt="Hello", max_tokens=10, temperature=1.0, seed=1234).choices[0].text
    assert a == b


def test_streaming_chat_with_usage(tiny):
    c = client(tiny)
    msgs = [{"role": "user", "content": "Tell me about Paris."}]
    full = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=10, temperature=0)
    chunks = list(c.chat.completions.create(model="tiny", messages=msgs, max_tokens=10, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == (full.choices[0].message.content or "")
    finals = [ch for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == full.choices[0].finish_reason
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == full.usage.completion_tokens
    assert last.usage.prompt_tokens == full.usage.prompt_tokens
    assert all(ch.usage is None for ch in chunks[:-1])
    assert len({ch.id for ch in chunks}) == 1


def test_raw_sse_framing(tiny):
    r = requests.post(tiny.url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 4, "stream": True, "temperature": 0}, stream=True)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [l for l in r.iter_lines(decode_unicode=True) if l]
    assert all(l.startswith("data: ") for l in events), events
    assert events[-1] == "data: [DONE]"
    objs = [json.loads(l[6:]) for l in events[:-1]]
    assert all(o["object"] == "text_completion" for o in objs)
    assert objs[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert "usage" not in objs[0]
