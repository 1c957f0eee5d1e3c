"""The prefix cache through the real server: a replayed multi-turn agent conversation with tool calls
through /v1/chat/completions (each assistant message sent back as a client re-renders it), on a
server with the cache (the default) and one started with --no-prefix-cache. Outputs must be equal,
`usage.prompt_tokens_details.cached_tokens` must grow turn by turn (and stay 0 without the cache),
and the vllm:prefix_cache_* counters must add up. A DFlash pair does the same through
/v1/completions."""
import json
import shutil

import pytest
import requests

from conftest import MODELS, ROOT, SCRIPTED_TOOL, TINY_CHAT, Server, metric
from test_tools import WEATHER_TOOL

TARGET = MODELS / "swa-yarn-perhead"
DRAFT = ROOT / "tests" / "fixtures" / "drafts" / "swa-yarn-perhead-causal-w8"


def chat(server, messages, **kw):
    body = {"model": "m", "messages": messages, "tools": [WEATHER_TOOL], "max_tokens": 24, **kw}
    r = requests.post(server.url + "/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def chat_stream_usage(server, messages, **kw):
    body = {"model": "m", "messages": messages, "tools": [WEATHER_TOOL], "max_tokens": 24, "stream": True,
            "stream_options": {"include_usage": True}, **kw}
    r = requests.post(server.url + "/v1/chat/completions", json=body, stream=True)
    assert r.status_code == 200, r.text
    usage = None
    for line in r.iter_lines():
        if line.startswith(b"data: ") and line != b"data: [DONE]":
            c = json.loads(line[6:])
            if c.get("usage"):
                usage = c["usage"]
    return usage


def as_sent_back(msg):
    """The assistant message as an OpenAI client sends it back (content, tool_calls)."""
    out = {"role": "assistant", "content": msg.get("content")}
    if msg.get("tool_calls"):
        out["tool_calls"] = [{"id": t["id"], "type": "function", "function": t["function"]} for t in msg["tool_calls"]]
    return out


def replay(server):
    """Five agent turns: tool call, tool result, follow-up questions; greedy, then a seeded turn."""
    msgs = [{"role": "system", "content": "You are a weather agent. Use the tools."},
            {"role": "user", "content": "What is the weather in Paris?"}]
    turns = []
    for t in range(5):
        kw = {"temperature": 0} if t < 4 else {"temperature": 0.8, "seed": 7}
        r = chat(server, msgs, **kw)
        msg = r["choices"][0]["message"]
        turns.append((msg.get("content"), [tc["function"] for tc in msg.get("tool_calls") or []], r["usage"]))
        msgs.append(as_sent_back(msg))
        for tc in msg.get("tool_calls") or []:
            msgs.append({"role": "tool", "tool_call_id": tc["id"], "content": json.dumps({"temperature": 20 + t, "sky": "sunny"})})
        if not msg.get("tool_calls"):
            msgs.append({"role": "user", "content": f"And tomorrow, day {t}?"})
    stream_usage = chat_stream_usage(server, msgs, temperature=0)
    return turns, stream_usage


@pytest.fixture(scope="module")
def scripted_dir():
    if not (SCRIPTED_TOOL / "config.json").exists():
        pytest.skip("scripted-tool fixture missing")
    return SCRIPTED_TOOL


def test_agent_replay_equals_no_prefix_cache(scripted_dir):
    results = {}
    for mode, extra in (("cache", []), ("nocache", ["--no-prefix-cache"])):
        s = Server(["--model", str(scripted_dir), "--device", "cpu", "--served-model-name", "m",
                    "--max-num-batched-tokens", "64", "--max-model-len", "1024",
                    "--kv-cache-memory-bytes", "256MiB", *extra], f"prefix-{mode}")
        try:
            turns, stream_usage = replay(s)
            m = requests.get(s.url + "/metrics").text
            queries = metric(m, "vllm:prefix_cache_queries_total", model_name="m")
            hits = metric(m, "vllm:prefix_cache_hits_total", model_name="m")
            logs = s.logs()
        finally:
            s.stop()
        results[mode] = turns
        usages = [u for _, _, u in turns] + [stream_usage]
        cached = [u["prompt_tokens_details"]["cached_tokens"] for u in usages]
        if mode == "cache":
            assert "prefix cache: on" in logs
            assert cached[0] == 0
            # Every later turn resumes from the previous one, deeper each time.
            assert all(b > a for a, b in zip(cached, cached[1:])), cached
            assert all(c < u["prompt_tokens"] for c, u in zip(cached, usages))
            assert queries == sum(u["prompt_tokens"] for u in usages)
            assert hits == sum(cached)
        else:
            assert "prefix cache: off" in logs
            assert cached == [0] * len(usages)
            assert hits == 0
    # Same content, same tool calls, same token counts, turn by turn.
    for (c1, t1, u1), (c2, t2, u2) in zip(results["cache"], results["nocache"]):
        assert (c1, t1) == (c2, t2)
        assert (u1["prompt_tokens"], u1["completion_tokens"]) == (u2["prompt_tokens"], u2["completion_tokens"])
    assert any(t for _, t, _ in results["cache"]), "the replay has tool calls"


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    if not (TARGET / "config.json").exists() or not (DRAFT / "config.json").exists() or not (TINY_CHAT / "tokenizer.json").exists():
        pytest.skip("DFlash fixtures missing")
    d = tmp_path_factory.mktemp("target")
    for f in ["config.json", "model.safetensors"]:
        shutil.copy(TARGET / f, d / f)
    shutil.copy(TINY_CHAT / "tokenizer.json", d / "tokenizer.json")
    return d


def test_dflash_turns_equal_no_prefix_cache(target_dir):
    outs = {}
    for mode, extra in (("cache", []), ("nocache", ["--no-prefix-cache"])):
        s = Server(["--model", str(target_dir), "--device", "cpu", "--served-model-name", "t", "--max-num-batched-tokens", "16", "--kv-cache-memory-bytes", "256MiB",
                    "--draft", str(DRAFT), "--num-speculative-tokens", "3", *extra], f"prefix-dflash-{mode}")
        try:
            prompt = [(j * 7 + 3) % 384 for j in range(17)]
            seen = []
            for t in range(3):
                # The ids of the output are not in the response: each turn extends the previous prompt.
                r = requests.post(s.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 9, "temperature": 0, "ignore_eos": True})
                assert r.status_code == 200, r.text
                j = r.json()
                seen.append((j["choices"][0]["text"], j["usage"]["prompt_tokens_details"]["cached_tokens"], len(prompt)))
                prompt = prompt + [(t * 13 + k) % 300 + 20 for k in range(6 + t)]
        finally:
            s.stop()
        outs[mode] = seen
    assert [x for x, _, _ in outs["cache"]] == [x for x, _, _ in outs["nocache"]]
    # Each turn resumes at the previous prompt's end (its snapshot).
    assert [c for _, c, _ in outs["cache"]] == [0] + [n for _, _, n in outs["cache"][:-1]]
    assert all(c == 0 for _, c, _ in outs["nocache"])
