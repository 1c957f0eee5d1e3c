"""Disconnects and concurrency: batching must not change greedy (or seeded) outputs."""
import json
import socket
import threading
import time

import openai
import requests

from conftest import metric


def running(server):
    return metric(requests.get(server.url + "/metrics").text, "vllm:num_requests_running", model_name="tiny")


def test_disconnect_mid_stream(tiny):
    before = metric(requests.get(tiny.url + "/metrics").text, "vllm:request_success_total", model_name="tiny", finished_reason="abort")
    body = json.dumps({"model": "tiny", "prompt": "Once upon a time", "max_tokens": 400, "stream": True, "ignore_eos": True, "temperature": 0})
    s = socket.create_connection(("127.0.0.1", tiny.port))
    s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n" + body).encode())
    got = b""
    while got.count(b"data: ") < 3:
        got += s.recv(4096)
    assert running(tiny) == 1
    s.close()
    t0 = time.time()
    while running(tiny) != 0:
        assert time.time() - t0 < 10, "request kept running after the client left"
        time.sleep(0.02)
    m = requests.get(tiny.url + "/metrics").text
    assert metric(m, "vllm:request_success_total", model_name="tiny", finished_reason="abort") == before + 1
    assert metric(m, "vllm:num_requests_waiting", model_name="tiny") == 0
    assert requests.get(tiny.url + "/health").status_code == 200
    r = requests.post(tiny.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
    assert r.status_code == 200


def test_32_concurrent_streams_match_alone(tiny):
    c = openai.OpenAI(base_url=tiny.url + "/v1", api_key="x", max_retries=0, timeout=300)
    topics = ["Paris", "Rust", "the sea", "numbers", "a fox", "SQL", "music", "weather"]
    reqs = []
    for i in range(32):
        msgs = [{"role": "user", "content": f"Request {i}: tell me about {topics[i % 8]}" + "!" * (i % 5)}]
        sampling = {"temperature": 0} if i % 4 else {"temperature": 0.8, "seed": 1000 + i}
        reqs.append((msgs, sampling))

    def run(msgs, sampling, stream):
        kw = dict(model="tiny", messages=msgs, max_tokens=12, extra_body={"ignore_eos": True}, **sampling)
        if not stream:
            r = c.chat.completions.create(**kw)
            return r.choices[0].message.content, r.usage.completion_tokens
        text, usage = "", None
        for ch in c.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
            if ch.choices:
                text += ch.choices[0].delta.content or ""
            if ch.usage:
                usage = ch.usage.completion_tokens
        return text, usage

    alone = [run(m, s, False) for m, s in reqs]
    assert len({a[0] for a in alone}) > 16, "prompts should give different outputs"
    results = [None] * 32
    errors = []

    def worker(i):
        try:
            results[i] = run(*reqs[i], True)
        except Exception as e:  # noqa: BLE001
            errors.append((i, e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    for i in range(32):
        assert results[i] == alone[i], (i, results[i], alone[i])
    m = requests.get(tiny.url + "/metrics").text
    assert metric(m, "laguna:max_batch_seqs", model_name="tiny") >= 4  # requests really were batched together
    assert running(tiny) == 0


def test_admission_limit_429():
    from conftest import TINY_CHAT, Server
    s = Server(["--model", str(TINY_CHAT), "--device", "cpu", "--served-model-name", "tiny", "--max-num-seqs", "1", "--max-waiting", "1"], "admission")
    try:
        # As long as the context allows (4,096 positions), so the first request is still running
        # when the second arrives even on a fast machine (a 2,000-token request could finish
        # within the 0.3 s a fixed sleep gave it).
        body = json.dumps({"prompt": "Once", "max_tokens": 4000, "stream": True, "ignore_eos": True})
        socks = []
        for name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):  # one running, then one waiting
            k = socket.create_connection(("127.0.0.1", s.port))
            k.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n" + body).encode())
            socks.append(k)
            t0 = time.time()
            while metric(requests.get(s.url + "/metrics").text, name, model_name="tiny") != 1:
                assert time.time() - t0 < 10, f"{name} never reached 1"
                time.sleep(0.005)
        r = requests.post(s.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1})
        assert r.status_code == 429, r.text
        assert r.json()["error"]["type"] == "RateLimitError"
        for k in socks:
            k.close()
        t0 = time.time()
        while requests.post(s.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}).status_code != 200:
            assert time.time() - t0 < 10, "slots were not freed after the clients left"
            time.sleep(0.05)
    finally:
        s.stop()
