"""POST /v1/messages and /v1/messages/count_tokens through the official `anthropic` SDK.

The reference for every generation is the same conversation sent to /v1/chat/completions (itself
checked against transformers in test_basic.py / test_tools.py): the Anthropic adapter must give the
same tokens, text, tool calls and counts, in Anthropic's shapes."""
import json

import anthropic
import pytest
import requests

from conftest import TINY_CHAT, Server

WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather for a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "The city name"},
                       "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"],
    },
}
WEATHER_CHAT = {"type": "function", "function": {"name": WEATHER["name"], "description": WEATHER["description"],
                                                 "parameters": WEATHER["input_schema"]}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
# Claude Code's first system block (measured in test_agent_clis.py); the hash changes per request
BILLING = "x-anthropic-billing-header: cc_version=2.1.332.0b8; cc_entrypoint=sdk-cli; cch=%s;"


# The SDK no longer has sampling parameters; laguna still reads them (older clients send them).
GREEDY = {"extra_body": {"temperature": 0}}


def client(server, key="unused"):
    return anthropic.Anthropic(base_url=server.url, api_key=key, max_retries=0)


def chat(server, messages, **kw):
    body = dict(model=kw.pop("model", "tiny"), messages=messages, temperature=0, **kw)
    r = requests.post(server.url + "/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_non_stream_matches_chat(tiny):
    m = client(tiny).messages.create(model="claude-sonnet-4-5-20250929", max_tokens=8, **GREEDY,
                                     system="Be brief.", messages=[{"role": "user", "content": "Hello world!"}])
    ref = chat(tiny, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello world!"}], max_tokens=8)
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert m.model == "claude-sonnet-4-5-20250929"  # any model name is accepted and echoed
    want = ref["choices"][0]["message"]["content"]
    assert "".join(b.text for b in m.content if b.type == "text") == want
    assert m.usage.input_tokens == ref["usage"]["prompt_tokens"]
    assert m.usage.output_tokens == ref["usage"]["completion_tokens"]
    assert m.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[ref["choices"][0]["finish_reason"]]


def test_stop_sequence(tiny):
    msgs = [{"role": "user", "content": "Hello world!"}]
    full = chat(tiny, msgs, max_tokens=8)["choices"][0]["message"]["content"]
    assert len(full) >= 4, full
    stop = full[2:4]
    ref = chat(tiny, msgs, max_tokens=8, stop=[stop])
    assert ref["choices"][0]["finish_reason"] == "stop" and ref["choices"][0]["stop_reason"] == stop
    m = client(tiny).messages.create(model="x", max_tokens=8, **GREEDY, messages=msgs, stop_sequences=[stop])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    assert "".join(b.text for b in m.content) == ref["choices"][0]["message"]["content"]


def test_stream_event_sequence_and_text(tiny):
    kw = dict(model="laguna", max_tokens=8, **GREEDY, messages=[{"role": "user", "content": "Hello world!"}])
    events = list(client(tiny).messages.create(stream=True, **kw))
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    body = [k for k in kinds[1:-2] if k != "ping"]
    assert body[0] == "content_block_start" and body[-1] == "content_block_stop"
    assert set(body[1:-1]) == {"content_block_delta"}
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    ref = chat(tiny, kw["messages"], max_tokens=8)
    assert text == ref["choices"][0]["message"]["content"]
    assert events[0].message.usage.input_tokens == ref["usage"]["prompt_tokens"]
    assert events[-2].usage.output_tokens == ref["usage"]["completion_tokens"]
    # the SDK's stream helper assembles the same message
    with client(tiny).messages.stream(**kw) as s:
        final = s.get_final_message()
    assert final.content[0].text == text


def test_raw_sse_framing(tiny):
    r = requests.post(tiny.url + "/v1/messages", stream=True, json={
        "model": "x", "max_tokens": 2, "stream": True, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    frames = [f for f in r.text.split("\n\n") if f.strip()]
    for f in frames:
        ev, data = f.split("\n")
        assert ev.startswith("event: ") and data.startswith("data: ")
        assert json.loads(data[6:])["type"] == ev[7:]
    assert "[DONE]" not in r.text


def test_system_blocks_and_billing_header_normalised(tiny):
    c = client(tiny)
    def count(system):
        return c.messages.count_tokens(model="claude-x", system=system, messages=[{"role": "user", "content": "hi"}]).input_tokens
    plain = count("Be brief.")
    a = count([{"type": "text", "text": BILLING % "00aa"}, {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}])
    b = count([{"type": "text", "text": BILLING % "ffff"}, {"type": "text", "text": "Be brief."}])
    s = count((BILLING % "1234") + "\nBe brief.")
    assert a == b == s == plain
    ref = chat(tiny, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}], max_tokens=1)
    assert plain == ref["usage"]["prompt_tokens"]
    # two blocks are joined with a newline
    two = count([{"type": "text", "text": "A."}, {"type": "text", "text": "B."}])
    ref2 = chat(tiny, [{"role": "system", "content": "A.\nB."}, {"role": "user", "content": "hi"}], max_tokens=1)
    assert two == ref2["usage"]["prompt_tokens"]


def test_count_tokens_matches_generation_usage(tiny):
    c = client(tiny)
    msgs = [{"role": "user", "content": [{"type": "text", "text": "One"}, {"type": "text", "text": "two"}]}]
    n = c.messages.count_tokens(model="m", messages=msgs).input_tokens
    m = c.messages.create(model="m", max_tokens=1, messages=msgs)
    assert n == m.usage.input_tokens > 0


def test_tool_round_trip(scripted):
    c = client(scripted)
    m = c.messages.create(model="claude-x", max_tokens=20000, **GREEDY, tools=[WEATHER], messages=ASK)
    # max_tokens above the 4096-token window is cut to what is left, not rejected (Claude Code sends 32000;
    # the SDK refuses more than ~21000 without streaming)
    assert m.stop_reason == "tool_use"
    (call,) = [b for b in m.content if b.type == "tool_use"]
    assert call.name == "get_weather" and call.input == {"city": "Paris"} and call.id.startswith("toolu_")
    ref = chat(scripted, ASK, model="scripted", tools=[WEATHER_CHAT], max_tokens=40)
    assert m.usage.input_tokens == ref["usage"]["prompt_tokens"]
    assert m.usage.output_tokens == ref["usage"]["completion_tokens"]

    follow = ASK + [{"role": "assistant", "content": m.content},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                  "content": [{"type": "text", "text": "sunny, 21 C"}]}]}]
    m2 = c.messages.create(model="claude-x", max_tokens=40, **GREEDY, tools=[WEATHER], messages=follow)
    ref_msgs = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
                                                               "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny, 21 C"}]
    ref2 = chat(scripted, ref_msgs, model="scripted", tools=[WEATHER_CHAT], max_tokens=40)
    assert m2.usage.input_tokens == ref2["usage"]["prompt_tokens"]


def test_tool_use_streams_input_json_and_thinking(scripted):
    kw = dict(model="claude-x", max_tokens=40, **GREEDY, tools=[WEATHER], messages=ASK,
              thinking={"type": "enabled", "budget_tokens": 1024})
    events = list(client(scripted).messages.create(stream=True, **kw))
    starts = [e.content_block.type for e in events if e.type == "content_block_start"]
    assert starts == ["thinking", "tool_use"]
    thinking = "".join(e.delta.thinking for e in events if e.type == "content_block_delta" and e.delta.type == "thinking_delta")
    assert thinking == "hmm"
    args = "".join(e.delta.partial_json for e in events if e.type == "content_block_delta" and e.delta.type == "input_json_delta")
    assert json.loads(args) == {"city": "Paris"}
    assert [e for e in events if e.type == "message_delta"][0].delta.stop_reason == "tool_use"
    with client(scripted).messages.stream(**kw) as s:
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "tool_use"]
    assert final.content[1].input == {"city": "Paris"}


def test_tool_choice_none_renders_no_tools(scripted):
    c = client(scripted)
    with_none = c.messages.count_tokens(model="x", messages=ASK, tools=[WEATHER], tool_choice={"type": "none"}).input_tokens
    without = c.messages.count_tokens(model="x", messages=ASK).input_tokens
    with_tools = c.messages.count_tokens(model="x", messages=ASK, tools=[WEATHER]).input_tokens
    assert with_none == without < with_tools
    m = c.messages.create(model="x", max_tokens=12, **GREEDY, messages=ASK, tools=[WEATHER], tool_choice={"type": "none"})
    assert not [b for b in m.content if b.type == "tool_use"] and m.stop_reason != "tool_use"


def test_errors_are_anthropic_objects(tiny):
    r = requests.post(tiny.url + "/v1/messages", data=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
    r = requests.post(tiny.url + "/v1/messages", json={"model": "x", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as e:
        client(tiny).messages.create(model="x", max_tokens=4, messages=[{"role": "user", "content": "word " * 600}])
    assert e.value.status_code == 400
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert "maximum context length is 512 tokens" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as e:
        client(tiny).messages.create(model="x", max_tokens=4, messages=[
            {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}])
    assert "text only" in e.value.body["error"]["message"]


def test_api_key_via_x_api_key_or_bearer():
    s = Server(["--model", str(TINY_CHAT), "--device", "cpu", "--api-key", "sekret", "--served-model-name", "tiny",
                "--max-model-len", "512"], "anthropic-key")
    try:
        with pytest.raises(anthropic.AuthenticationError) as e:
            client(s, "wrong").messages.create(model="x", max_tokens=1, messages=[{"role": "user", "content": "hi"}])
        assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "authentication_error"
        r = requests.post(s.url + "/v1/messages/count_tokens", json={"model": "x", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        m = client(s, "sekret").messages.create(model="x", max_tokens=1, messages=[{"role": "user", "content": "hi"}])
        assert m.usage.output_tokens == 1
        r = requests.post(s.url + "/v1/messages", headers={"authorization": "Bearer sekret"},
                          json={"model": "x", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200
        # x-api-key works on the OpenAI routes too
        assert requests.get(s.url + "/v1/models", headers={"x-api-key": "sekret"}).status_code == 200
        r = requests.get(s.url + "/v1/models", headers={"x-api-key": "nope"})
        assert r.status_code == 401 and r.json()["error"]["type"] == "AuthenticationError"
    finally:
        s.stop()
