"""POST /v1/responses (and GET /v1/responses/{id}) through the official `openai` SDK.

The reference for every generation is the same conversation sent to /v1/chat/completions: the
Responses adapter must give the same tokens, text and tool calls, as Responses items and events."""
import json

import openai
import pytest
import requests

WEATHER = {"type": "function", "name": "get_weather", "description": "Get the current weather for a city",
           "parameters": {"type": "object",
                          "properties": {"city": {"type": "string", "description": "The city name"},
                                         "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                          "required": ["city"]}}
WEATHER_CHAT = {"type": "function", "function": {k: WEATHER[k] for k in ("name", "description", "parameters")}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def chat(server, messages, **kw):
    body = dict(model=kw.pop("model", "tiny"), messages=messages, temperature=0, **kw)
    r = requests.post(server.url + "/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_create_matches_chat(tiny):
    r = client(tiny).responses.create(model="tiny", instructions="Be brief.", input="Hello world!",
                                      max_output_tokens=8, temperature=0)
    ref = chat(tiny, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello world!"}], max_tokens=8)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == "tiny"
    assert r.output_text == ref["choices"][0]["message"]["content"]
    assert r.usage.input_tokens == ref["usage"]["prompt_tokens"]
    assert r.usage.output_tokens == ref["usage"]["completion_tokens"]
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    if ref["choices"][0]["finish_reason"] == "length":
        assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    else:
        assert r.status == "completed"
    (msg,) = r.output
    assert msg.type == "message" and msg.role == "assistant" and msg.content[0].type == "output_text"
    assert r.instructions == "Be brief." and r.max_output_tokens == 8


def test_stream_events(tiny):
    kw = dict(model="tiny", input=[{"role": "user", "content": [{"type": "input_text", "text": "Hello world!"}]}],
              max_output_tokens=8, temperature=0)
    events = list(client(tiny).responses.create(stream=True, **kw))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert kinds[2:5] == ["response.output_item.added", "response.content_part.added", "response.output_text.delta"]
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    ref = chat(tiny, [{"role": "user", "content": "Hello world!"}], max_tokens=8)
    assert text == ref["choices"][0]["message"]["content"]
    done = [e for e in events if e.type == "response.output_text.done"][0]
    assert done.text == text
    final = events[-1].response
    assert final.output_text == text and final.usage.input_tokens == ref["usage"]["prompt_tokens"]
    assert events[0].response.status == "in_progress" and events[0].response.id == final.id


def test_previous_response_id_and_retrieve(tiny):
    c = client(tiny)
    r1 = c.responses.create(model="tiny", input="Hello world!", max_output_tokens=4, temperature=0)
    r2 = c.responses.create(model="tiny", previous_response_id=r1.id, input="And again?", max_output_tokens=4, temperature=0)
    ref = chat(tiny, [{"role": "user", "content": "Hello world!"}, {"role": "assistant", "content": r1.output_text},
                      {"role": "user", "content": "And again?"}], max_tokens=4)
    assert r2.usage.input_tokens == ref["usage"]["prompt_tokens"]
    assert r2.output_text == ref["choices"][0]["message"]["content"]
    got = c.responses.retrieve(r1.id)
    assert got.id == r1.id and got.output_text == r1.output_text
    # instructions are not carried over by previous_response_id
    r3 = c.responses.create(model="tiny", instructions="Be brief.", input="x", max_output_tokens=1)
    r4 = c.responses.create(model="tiny", previous_response_id=r3.id, input="y", max_output_tokens=1)
    ref4 = chat(tiny, [{"role": "user", "content": "x"}, {"role": "assistant", "content": r3.output_text},
                       {"role": "user", "content": "y"}], max_tokens=1)
    assert r4.usage.input_tokens == ref4["usage"]["prompt_tokens"]


def test_store_false_is_not_kept(tiny):
    c = client(tiny)
    r = c.responses.create(model="tiny", input="hi", max_output_tokens=1, store=False)
    with pytest.raises(openai.NotFoundError):
        c.responses.create(model="tiny", input="more", previous_response_id=r.id, max_output_tokens=1)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.create(model="tiny", input="more", previous_response_id="resp_nope", max_output_tokens=1)


def test_function_call_output_round_trip(scripted):
    c = client(scripted)
    r = c.responses.create(model="scripted", input=ASK, tools=[WEATHER], temperature=0, max_output_tokens=40)
    (call,) = [o for o in r.output if o.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert call.call_id and call.id.startswith("fc_") and r.status == "completed"
    ref = chat(scripted, ASK, model="scripted", tools=[WEATHER_CHAT], max_tokens=40)
    assert r.usage.input_tokens == ref["usage"]["prompt_tokens"]
    assert r.usage.output_tokens == ref["usage"]["completion_tokens"]

    # stateless (store=False) like Codex: the client sends the whole history back
    items = ASK + [o.model_dump(exclude_none=True) for o in r.output] + [
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}]
    r2 = c.responses.create(model="scripted", input=items, tools=[WEATHER], temperature=0, max_output_tokens=40, store=False)
    ref_msgs = ASK + [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                                                             "function": {"name": "get_weather", "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny, 21 C"}]
    ref2 = chat(scripted, ref_msgs, model="scripted", tools=[WEATHER_CHAT], max_tokens=40)
    assert r2.usage.input_tokens == ref2["usage"]["prompt_tokens"]

    # the same through previous_response_id
    r3 = c.responses.create(model="scripted", previous_response_id=r.id, tools=[WEATHER], temperature=0, max_output_tokens=40,
                            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}])
    assert r3.usage.input_tokens == ref2["usage"]["prompt_tokens"]


def test_function_call_streams_arguments_and_reasoning(scripted):
    events = list(client(scripted).responses.create(model="scripted", input=ASK, tools=[WEATHER], temperature=0,
                                                    max_output_tokens=40, reasoning={"effort": "medium"}, stream=True))
    added = [e.item.type for e in events if e.type == "response.output_item.added"]
    assert added == ["reasoning", "function_call"]
    reasoning = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert reasoning == "hmm"
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert json.loads(args) == {"city": "Paris"}
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done.arguments == args
    final = events[-1].response
    assert events[-1].type == "response.completed"
    assert [o.type for o in final.output] == ["reasoning", "function_call"]
    assert final.output[0].content[0].text == "hmm"
    assert final.usage.output_tokens_details.reasoning_tokens >= 1


def test_unknown_tool_types_are_ignored(scripted):
    c = client(scripted)
    only = c.responses.create(model="scripted", input="hi", tools=[WEATHER], max_output_tokens=1)
    mixed = c.responses.create(model="scripted", input="hi", max_output_tokens=1,
                               tools=[{"type": "web_search"}, WEATHER, {"type": "file_search", "vector_store_ids": ["v"]}])
    assert mixed.usage.input_tokens == only.usage.input_tokens
    none = c.responses.create(model="scripted", input="hi", tools=[WEATHER], tool_choice="none", max_output_tokens=1)
    bare = c.responses.create(model="scripted", input="hi", max_output_tokens=1)
    assert none.usage.input_tokens == bare.usage.input_tokens < only.usage.input_tokens


def test_errors(tiny):
    r = requests.post(tiny.url + "/v1/responses", data=b"{nope", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "BadRequestError"
    with pytest.raises(openai.NotFoundError):
        client(tiny).responses.create(model="nope", input="hi", max_output_tokens=1)
    with pytest.raises(openai.BadRequestError) as e:
        client(tiny).responses.create(model="tiny", input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": "data:image/png;base64,AA=="}]}], max_output_tokens=1)
    assert "text only" in str(e.value)
