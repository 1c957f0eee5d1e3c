"""Constrained decoding (llguidance) against the real server and the tiny random-weight model,
whose unconstrained output is noise: every forced tool call must come back through the server's
own tool parser as `tool_calls` whose arguments validate against the tool's schema, and every
`response_format` output must validate, across seeds and temperatures (0 included)."""
import json
import shutil

import jsonschema
import openai
import pytest
import requests

from conftest import MODELS, ROOT, TINY_CHAT, Server, _need

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "days": {"type": "integer", "minimum": 1, "maximum": 14},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "hourly": {"type": "boolean"},
            },
            "required": ["city", "days"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "minLength": 1, "maxLength": 10},
                "filters": {
                    "type": "array",
                    "items": {"type": "object", "properties": {"k": {"type": "string", "maxLength": 4}, "v": {"type": "number"}},
                              "required": ["k", "v"], "additionalProperties": False},
                    "maxItems": 2,
                },
                "limit": {"type": ["integer", "null"], "minimum": 0, "maximum": 50},
            },
            "required": ["query", "filters"],
        },
    },
}
TOOLS = [WEATHER, SEARCH]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
RUNS = [(seed, t) for seed in range(4) for t in (0.0, 0.8, 1.5)]

REPLY = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "maxLength": 16},
        "score": {"type": "integer", "minimum": -10, "maximum": 10},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        "ok": {"type": "boolean"},
    },
    "required": ["answer", "score", "ok"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def srv():
    _need(TINY_CHAT)
    s = Server(["--model", str(TINY_CHAT), "--device", "cpu", "--served-model-name", "tiny", "--max-model-len", "4096",
                "--max-num-seqs", "4", "--max-num-batched-tokens", "256", "--kv-cache-memory-bytes", "256MiB"], "constrained")
    yield s
    s.stop()


def chat(server, **body):
    body = {"model": "tiny", "messages": ASK, "max_tokens": 400, **NO_THINK, **body}
    r = requests.post(server.url + "/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def check_calls(msg, allowed=("get_weather", "search")):
    calls = msg.get("tool_calls") or []
    assert calls, msg
    for c in calls:
        name = c["function"]["name"]
        assert name in allowed, msg
        jsonschema.validate(json.loads(c["function"]["arguments"]), SCHEMAS[name])
    return calls


@pytest.mark.parametrize("seed,temperature", RUNS)
def test_required_tool_call_parses_and_validates(srv, seed, temperature):
    r = chat(srv, tools=TOOLS, tool_choice="required", seed=seed, temperature=temperature)
    ch = r["choices"][0]
    assert ch["finish_reason"] == "tool_calls", ch
    assert not ch["message"]["content"], ch
    check_calls(ch["message"])


@pytest.mark.parametrize("seed,temperature", RUNS[:6])
def test_named_tool_choice_calls_only_that_tool(srv, seed, temperature):
    tc = {"type": "function", "function": {"name": "search"}}
    r = chat(srv, tools=TOOLS, tool_choice=tc, seed=seed, temperature=temperature, parallel_tool_calls=False)
    ch = r["choices"][0]
    assert ch["finish_reason"] == "tool_calls", ch
    (call,) = check_calls(ch["message"], allowed=("search",))


def test_forced_call_streams_as_tool_call_deltas(srv):
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused")
    for seed in range(3):
        chunks = list(c.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice="required", seed=seed,
                                                temperature=1.0, max_tokens=400, stream=True, extra_body=NO_THINK))
        args, names = {}, {}
        for ch in chunks:
            for d in (ch.choices[0].delta.tool_calls or []) if ch.choices else []:
                if d.function and d.function.name:
                    names[d.index] = d.function.name
                args[d.index] = args.get(d.index, "") + ((d.function and d.function.arguments) or "")
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
        assert names and set(names) == set(args)
        for i, a in args.items():
            jsonschema.validate(json.loads(a), SCHEMAS[names[i]])


def test_forced_call_after_reasoning(srv):
    """Thinking on: free reasoning, `</think>`, then the call (the reasoning is not constrained,
    so give it room)."""
    for seed in range(2):
        r = chat(srv, tools=TOOLS, tool_choice="required", seed=seed, temperature=1.0, max_tokens=3000,
                 chat_template_kwargs={"enable_thinking": True})
        ch = r["choices"][0]
        assert ch["finish_reason"] == "tool_calls", ch
        assert "</think>" not in (ch["message"]["reasoning_content"] or "")
        check_calls(ch["message"])


@pytest.mark.parametrize("seed,temperature", RUNS)
def test_json_schema_outputs_validate(srv, seed, temperature):
    rf = {"type": "json_schema", "json_schema": {"name": "reply", "strict": True, "schema": REPLY}}
    r = chat(srv, response_format=rf, seed=seed, temperature=temperature)
    ch = r["choices"][0]
    assert ch["finish_reason"] == "stop", ch
    jsonschema.validate(json.loads(ch["message"]["content"]), REPLY)


def test_json_object_is_an_object(srv):
    for seed in range(3):
        r = chat(srv, response_format={"type": "json_object"}, seed=seed, temperature=0.7, max_tokens=3000)
        ch = r["choices"][0]
        assert ch["finish_reason"] == "stop", ch
        assert isinstance(json.loads(ch["message"]["content"]), dict)


def test_errors_are_400s(srv):
    def post(**body):
        return requests.post(srv.url + "/v1/chat/completions", json={"model": "tiny", "messages": ASK, "max_tokens": 5, **body})

    r = post(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice", r.text
    assert "nope" in r.json()["error"]["message"]
    r = post(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "wat"}}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format", r.text
    r = post(response_format={"type": "yaml"})
    assert r.status_code == 400, r.text
    bad_tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 5, "maximum": 1}}}}}
    r = post(tools=[bad_tool], tool_choice="required")
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools", r.text
    # The server still serves afterwards.
    assert chat(srv, max_tokens=3)["choices"][0]["finish_reason"] in ("stop", "length")


TARGET = MODELS / "swa-yarn-perhead"
DRAFT = ROOT / "tests" / "fixtures" / "drafts" / "swa-yarn-perhead-causal-w8"


def test_dflash_constrained_matches_plain(tmp_path):
    """Greedy JSON-schema output with the DFlash draft is the output without it."""
    if not (TARGET / "config.json").exists() or not (DRAFT / "config.json").exists():
        pytest.skip("DFlash fixtures missing")
    for f in ["config.json", "model.safetensors"]:
        shutil.copy(TARGET / f, tmp_path / f)
    shutil.copy(TINY_CHAT / "tokenizer.json", tmp_path / "tokenizer.json")  # ids past the target's 384 are never sampled
    prompts = [[(i * 31 + j * 7 + 3) % 384 for j in range(6 + 3 * i)] for i in range(3)]
    small = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 999},
                                              "b": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}},
             "required": ["a", "b"], "additionalProperties": False}
    rf = {"type": "json_schema", "json_schema": {"name": "small", "schema": small}}
    outs = {}
    for mode, extra in (("plain", []), ("dflash", ["--draft", str(DRAFT), "--num-speculative-tokens", "3"])):
        s = Server(["--model", str(tmp_path), "--device", "cpu", "--served-model-name", "t", "--max-num-batched-tokens", "16", "--kv-cache-memory-bytes", "256MiB", *extra], f"c{mode}")
        try:
            r = requests.post(s.url + "/v1/completions", json={"prompt": prompts, "max_tokens": 100, "temperature": 0, "response_format": rf})
            assert r.status_code == 200, r.text
            outs[mode] = [c["text"] for c in r.json()["choices"]]
            assert all(c["finish_reason"] == "stop" for c in r.json()["choices"]), r.json()
        finally:
            s.stop()
    assert outs["dflash"] == outs["plain"]
    for t in outs["plain"]:
        jsonschema.validate(json.loads(t), small)
