"""Load and abuse, bounded and loopback only: concurrent streams, oversized bodies, clients that
leave mid-request or mid-stream, and a seeded fuzzer of random and mutated JSON across every POST
route, all at once. Asserts no 5xx (status or in-stream error), /health always answers, and the
well-formed greedy requests that ran among them answer exactly what they answer alone.

Every case is a function of (SEED, index): a failure prints both, and `fuzz_case(i)` rebuilds it."""
import copy
import json
import random
import socket
import threading
import time

import pytest
import requests

from conftest import TINY_CHAT, Server, metric

SEED = 20261207
N_FUZZ = 2000
LIMIT = 1 << 20
ROUTES = ["/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens", "/v1/responses"]


@pytest.fixture(scope="module")
def srv():
    s = Server(["--model", str(TINY_CHAT), "--device", "cpu", "--served-model-name", "tiny", "--max-model-len", "160",
                "--max-num-seqs", "8", "--max-request-bytes", "1MiB"], "abuse")
    yield s
    s.stop()


TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def valid(route: str, rng: random.Random) -> dict:
    """A well-formed request for `route` with some of its optional fields."""
    text = rng.choice(["Hello", "Tell me about Paris", "2+2=", "Write a haiku", "¿Qué tal?", "日本語で", "emoji 🎉"])
    msgs = [{"role": "user", "content": text}]
    opt = lambda: rng.random() < 0.3  # noqa: E731
    if route == "/v1/chat/completions":
        b = {"model": "tiny", "messages": msgs, "max_tokens": rng.randint(1, 12), "temperature": 0}
        if opt():
            b["stream"] = True
        if opt():
            b["tools"] = [TOOL]
            b["tool_choice"] = rng.choice(["auto", "none", "required", {"type": "function", "function": {"name": "get_weather"}}])
        if opt():
            b["logprobs"], b["top_logprobs"] = True, rng.randint(0, 5)
        if opt():
            b["stop"] = ["a", "\n"]
        if opt():
            b["response_format"] = rng.choice([{"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}])
        if opt():
            b["temperature"], b["top_p"], b["top_k"], b["seed"] = 0.7, 0.9, 20, rng.randint(0, 1000)
        return b
    if route == "/v1/completions":
        b = {"model": "tiny", "prompt": rng.choice([text, [text, "Another"], [1, 2, 3], [[1, 2], [3]]]), "max_tokens": rng.randint(1, 12)}
        if opt():
            b["stream"] = True
        if opt():
            b["echo"], b["logprobs"] = True, 2
        return b
    if route in ("/v1/messages", "/v1/messages/count_tokens"):
        b = {"model": "tiny", "messages": msgs}
        if route == "/v1/messages":
            b["max_tokens"] = rng.randint(1, 12)
            if opt():
                b["stream"] = True
        if opt():
            b["system"] = rng.choice(["Be brief.", [{"type": "text", "text": "Be brief."}]])
        if opt():
            b["tools"] = [{"name": "get_weather", "description": "w", "input_schema": TOOL["function"]["parameters"]}]
        return b
    b = {"model": "tiny", "input": rng.choice([text, [{"role": "user", "content": text}]]), "max_output_tokens": rng.randint(1, 12)}
    if opt():
        b["stream"] = True
    if opt():
        b["instructions"] = "Be brief."
    return b


def nested(depth: int, rng: random.Random):
    v = 1
    for _ in range(depth):
        v = [v] if rng.random() < 0.5 else {"a": v}
    return v


def weird(rng: random.Random):
    return rng.choice([
        lambda: None, lambda: True, lambda: False, lambda: 0, lambda: -1, lambda: 1, lambda: 2 ** 31, lambda: 2 ** 63,
        lambda: 2 ** 64 + 1, lambda: -(2 ** 63) - 1, lambda: 1e308, lambda: -1e308, lambda: 1e-320, lambda: 0.5, lambda: 1e39,
        lambda: float("nan"), lambda: float("inf"), lambda: "NaN", lambda: "Infinity", lambda: "-inf", lambda: "",
        lambda: "\u0000", lambda: "💥" * rng.randint(1, 200), lambda: "a" * rng.randint(1000, 20000),
        lambda: "".join(chr(rng.randint(1, 0x2FFFF)) for _ in range(rng.randint(1, 50))).encode("utf-8", "surrogatepass").decode("utf-8", "replace"),
        lambda: [], lambda: {}, lambda: [1, 2, 3], lambda: {"a": 1}, lambda: nested(rng.randint(2, 300), rng),
        lambda: [None] * 3, lambda: {"type": "function"}, lambda: "required", lambda: "none", lambda: {"type": "json_object"},
        lambda: {"type": "json_schema", "json_schema": {"schema": {"type": "array", "items": {"$ref": "#"}}}},
        lambda: [{"role": "tool", "content": None}], lambda: [{"role": rng.choice(["system", "assistant", "x"]), "content": [{"type": "image_url"}]}],
    ])()


def paths(v, depth=0):
    """Every (container, key) inside a JSON value, down to depth 12 (deeper is nesting the fuzzer made)."""
    out = []
    if depth > 12:
        return out
    if isinstance(v, dict):
        for k, x in v.items():
            out.append((v, k))
            out += paths(x, depth + 1)
    elif isinstance(v, list):
        for i, x in enumerate(v):
            out.append((v, i))
            out += paths(x, depth + 1)
    return out


FIELDS = ["stream", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "n", "stop", "stop_token_ids", "logprobs",
          "top_logprobs", "tools", "tool_choice", "response_format", "messages", "prompt", "input", "system", "echo",
          "max_completion_tokens", "max_output_tokens", "presence_penalty", "frequency_penalty", "repetition_penalty",
          "ignore_eos", "stream_options", "chat_template_kwargs", "previous_response_id", "thinking", "metadata", "x-extra"]


def fuzz_case(i: int) -> tuple[str, bytes]:
    rng = random.Random(f"{SEED}:{i}")
    route = rng.choice(ROUTES)
    kind = rng.random()
    if kind < 0.05:  # not JSON at all
        return route, bytes(rng.randrange(256) for _ in range(rng.randint(0, 300)))
    b = copy.deepcopy(valid(route, rng))  # mutated in place: not the shared TOOL
    if kind < 0.10:  # truncated
        s = json.dumps(b).encode()
        return route, s[: rng.randint(0, len(s))]
    if kind < 0.13:  # valid JSON, not an object
        return route, json.dumps(weird(rng), allow_nan=True).encode()
    if kind < 0.25:  # well-formed, with an unknown field
        b["x-extra"] = weird(rng)
        return route, json.dumps(b, allow_nan=True).encode()
    for _ in range(rng.randint(1, 3)):
        op = rng.random()
        slots = paths(b)
        if op < 0.35 and slots:  # a value of the wrong type or out of range
            c, k = rng.choice(slots)
            c[k] = weird(rng)
        elif op < 0.55 and slots:  # a field missing
            c, k = rng.choice(slots)
            if isinstance(c, dict):
                del c[k]
            elif c:
                c.pop(k)
        elif op < 0.85:  # a known field set anywhere (extra, or a right name with a wrong value)
            b[rng.choice(FIELDS)] = weird(rng)
        else:  # deep nesting
            b[rng.choice(FIELDS)] = nested(rng.randint(100, 5000), rng)
    try:
        body = json.dumps(b, allow_nan=True, ensure_ascii=rng.random() < 0.5)
    except (RecursionError, ValueError):
        body = "{" * 10000
    if rng.random() < 0.05:  # numbers JSON allows but no float holds
        body = body.replace("0.5", "1e400", 1).replace("1.0", "-1e400", 1)
    return route, body.encode("utf-8", "surrogatepass")


def read_all(route: str, body: bytes, timeout=120) -> tuple[int, str]:
    r = requests.post(SRV.url + route, data=body, headers={"content-type": "application/json"}, timeout=timeout)
    return r.status_code, r.text


def server_errors(status: int, text: str) -> bool:
    """A 5xx status, or an error object with a 5xx code inside a 200 stream."""
    return status >= 500 or '"InternalServerError"' in text or '"api_error"' in text or '"code":500' in text.replace(" ", "")


def well_formed(i: int) -> tuple[str, dict]:
    rng = random.Random(f"{SEED}:well:{i}")
    route = ["/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses"][i % 4]
    b = valid(route, rng)
    for k in ("tools", "tool_choice", "response_format", "top_p", "top_k", "seed", "logprobs", "top_logprobs", "echo", "stop"):
        b.pop(k, None)
    b["temperature"] = 0
    b["stream"] = i % 3 == 0
    return route, b


def answer(route: str, b: dict) -> str:
    """The generated text of a well-formed request (streamed or not)."""
    status, text = read_all(route, json.dumps(b).encode())
    assert status == 200, (route, b, text)
    if not b.get("stream"):
        v = json.loads(text)
        if route == "/v1/chat/completions":
            return v["choices"][0]["message"]["content"]
        if route == "/v1/completions":
            return "|".join(c["text"] for c in sorted(v["choices"], key=lambda c: c["index"]))
        if route == "/v1/messages":
            return "".join(c.get("text", "") for c in v["content"])
        return "".join(p["text"] for o in v["output"] if o["type"] == "message" for p in o["content"])
    out = {}
    for line in text.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if route == "/v1/chat/completions":
            for c in ev["choices"]:
                out[0] = out.get(0, "") + (c["delta"].get("content") or "")
        elif route == "/v1/completions":
            for c in ev["choices"]:
                out[c["index"]] = out.get(c["index"], "") + c["text"]
        elif route == "/v1/messages" and ev["type"] == "content_block_delta" and ev["delta"]["type"] == "text_delta":
            out[0] = out.get(0, "") + ev["delta"]["text"]
        elif route == "/v1/responses" and ev["type"] == "response.output_text.delta":
            out[0] = out.get(0, "") + ev["delta"]
    return "|".join(out[k] for k in sorted(out))


SRV = None


def test_load_and_abuse(srv):
    global SRV
    SRV = srv
    wf = [well_formed(i) for i in range(16)]
    alone = [answer(r, b) for r, b in wf]
    assert len(set(alone)) > 4, "the well-formed requests should not all say the same"

    stop = threading.Event()
    failures, health, statuses = [], [], {}
    together = [None] * len(wf)

    def guard(name, f):
        def run():
            try:
                f()
            except Exception as e:  # noqa: BLE001
                failures.append(f"{name}: {e!r}")
        return threading.Thread(target=run, name=name)

    def fuzzer(worker, workers):
        for i in range(worker, N_FUZZ, workers):
            route, body = fuzz_case(i)
            try:
                status, text = read_all(route, body)
            except requests.RequestException as e:
                failures.append(f"fuzz seed {SEED} case {i} ({route}): {e!r}")
                continue
            statuses[status] = statuses.get(status, 0) + 1
            if server_errors(status, text):
                failures.append(f"fuzz seed {SEED} case {i} ({route}) -> {status}: {text[:300]} body {body[:300]!r}")

    def concurrent_well_formed():
        threads = []
        for j, (r, b) in enumerate(wf):
            def one(j=j, r=r, b=b):
                together[j] = answer(r, b)
            threads.append(guard(f"well-formed {j}", one))
        for t in threads:
            t.start()
            time.sleep(0.2)
        for t in threads:
            t.join()

    def oversized():
        big = b'{"model":"tiny","prompt":"' + b"a" * (LIMIT + 10) + b'"}'
        for j in range(6):
            route = ROUTES[j % len(ROUTES)]
            data = big if j % 2 == 0 else (big[k:k + 65536] for k in range(0, len(big), 65536))  # chunked
            try:
                r = requests.post(srv.url + route, data=data, headers={"content-type": "application/json"}, timeout=60)
                assert r.status_code == 413, (route, r.status_code, r.text[:200])
            except requests.ConnectionError:
                pass  # the server answered 413 and closed while the body was still being sent

    def disconnects():
        rng = random.Random(f"{SEED}:disconnect")
        for j in range(24):
            route = rng.choice(["/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses"])
            b = valid(route, rng)
            b["stream"] = True
            b.update({"max_tokens": 100} if route != "/v1/responses" else {"max_output_tokens": 100})
            body = json.dumps(b).encode()
            k = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
            head = f"POST {route} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            if j % 3 == 0:  # leaves halfway through sending the body
                k.sendall(head + body[: len(body) // 2])
            else:
                k.sendall(head + body)
                got = b""
                want = 1 if j % 3 == 1 else 3  # leaves after the headers, or mid-stream
                while not (b"\r\n\r\n" in got and (want == 1 or got.count(b"data: ") >= want)):
                    if b"\r\n\r\n" in got and not got.startswith(b"HTTP/1.1 200"):
                        break  # an error answer: not a stream to leave
                    chunk = k.recv(4096)
                    if not chunk:
                        break
                    got += chunk
                assert not got.startswith(b"HTTP/1.1 5"), got[:300]
            k.close()

    def health_poll():
        while not stop.is_set():
            t0 = time.monotonic()
            r = requests.get(srv.url + "/health", timeout=10)
            health.append((r.status_code, time.monotonic() - t0))
            time.sleep(0.05)

    poller = guard("health", health_poll)
    poller.start()
    workers = 4
    jobs = [guard(f"fuzz {w}", lambda w=w: fuzzer(w, workers)) for w in range(workers)]
    jobs += [guard("well-formed", concurrent_well_formed), guard("oversized", oversized), guard("disconnects", disconnects)]
    t0 = time.monotonic()
    for t in jobs:
        t.start()
    for t in jobs:
        t.join(600)
    stop.set()
    poller.join(15)
    elapsed = time.monotonic() - t0
    assert not failures, "\n".join(failures[:20])
    assert all(s == 200 for s, _ in health), [h for h in health if h[0] != 200][:5]
    assert len(health) > 10
    # The fuzzer reaches generation, not only the parser: a fair share of its requests are served.
    assert statuses.get(200, 0) > N_FUZZ // 10, statuses
    for j in range(len(wf)):
        assert together[j] == alone[j], (j, wf[j], together[j], alone[j])
    t1 = time.time()
    while metric(requests.get(srv.url + "/metrics").text, "vllm:num_requests_running", model_name="tiny") != 0:
        assert time.time() - t1 < 15, "requests kept running after every client left"
        time.sleep(0.05)
    assert srv.proc.poll() is None
    print(f"abuse: {N_FUZZ} fuzzed requests in {elapsed:.1f} s (statuses {sorted(statuses.items())}), slowest /health {max(h for _, h in health) * 1e3:.0f} ms")
