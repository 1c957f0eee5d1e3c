"""Tool calls (poolside_v1 format) and reasoning with the scripted-tool model, whose greedy output
after a thinking-off prompt is `<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call></assistant>`
and after a thinking-on prompt `hmm</think>` followed by the same call."""
import json

import openai
import requests

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused")


def test_tool_call_round_trip(scripted):
    c = client(scripted)
    r = c.chat.completions.create(model="scripted", messages=ASK, tools=[WEATHER_TOOL], temperature=0, max_tokens=40)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    assert ch.message.content is None
    (tc,) = ch.message.tool_calls
    assert tc.type == "function" and tc.id
    assert tc.function.name == "get_weather"
    assert json.loads(tc.function.arguments) == {"city": "Paris"}
    assert r.usage.completion_tokens == 10  # 9 call tokens + </assistant>

    # the client runs the tool and sends the result back with tool_call_id
    msgs = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [tc.model_dump()]},
        {"role": "tool", "tool_call_id": tc.id, "content": json.dumps({"temperature": 21, "sky": "sunny"})},
    ]
    r2 = c.chat.completions.create(model="scripted", messages=msgs, tools=[WEATHER_TOOL], temperature=0, max_tokens=40)
    assert r2.choices[0].finish_reason in ("tool_calls", "stop", "length")
    # the replayed call and the tool result are in the prompt: it grew by the call + response turn
    assert r2.usage.prompt_tokens > r.usage.prompt_tokens + 10


def test_tool_call_streaming_deltas(scripted):
    c = client(scripted)
    chunks = list(c.chat.completions.create(model="scripted", messages=ASK, tools=[WEATHER_TOOL], temperature=0, max_tokens=40, stream=True))
    deltas = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
    assert deltas, chunks
    first = deltas[0]
    assert first.index == 0 and first.id and first.type == "function"
    assert first.function.name == "get_weather" and first.function.arguments == ""
    rest = deltas[1:]
    assert rest and all(d.id is None and d.function.name is None for d in rest)
    args = "".join(d.function.arguments for d in rest)
    assert json.loads(args) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)


def test_reasoning_split_thinking_on(scripted):
    body = {"model": "scripted", "messages": ASK, "tools": [WEATHER_TOOL], "temperature": 0, "max_tokens": 40,
            "chat_template_kwargs": {"enable_thinking": True}}
    j = requests.post(scripted.url + "/v1/chat/completions", json=body).json()
    msg = j["choices"][0]["message"]
    assert msg["reasoning_content"] == "hmm" and msg["reasoning"] == "hmm"
    assert msg["content"] is None
    assert json.loads(msg["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    assert j["choices"][0]["finish_reason"] == "tool_calls"

    r = requests.post(scripted.url + "/v1/chat/completions", json=dict(body, stream=True), stream=True)
    reasoning, reasoning2, content = "", "", ""
    for line in r.iter_lines(decode_unicode=True):
        if not line or line == "data: [DONE]":
            continue
        d = json.loads(line[6:])["choices"][0]["delta"]
        reasoning += d.get("reasoning_content") or ""
        reasoning2 += d.get("reasoning") or ""
        content += d.get("content") or ""
    assert reasoning == "hmm" and reasoning2 == "hmm" and content == ""


def test_thinking_off_keeps_text_as_content(scripted):
    # tool_choice none: no parsing, the raw call text is content (special </assistant> dropped)
    r = client(scripted).chat.completions.create(model="scripted", messages=ASK, tools=[WEATHER_TOOL], tool_choice="none",
                                                  temperature=0, max_tokens=40)
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>"
    assert not r.choices[0].message.tool_calls


def test_plain_completion_runs_to_length(scripted):
    r = client(scripted).completions.create(model="scripted", prompt="Tell me a story.", max_tokens=8, temperature=0)
    assert r.choices[0].text == " hello world hello world hello world hello world"
    assert r.choices[0].finish_reason == "length"
