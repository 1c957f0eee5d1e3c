"""The front door: the body limit (413, Content-Length and chunked), the prompt cap of
/v1/completions, the early length check, large requests prepared off the async workers (the stall
test), and the memory of large requests given back (docs/design/serving.md)."""
import json
import socket
import threading
import time

import pytest
import requests

from conftest import TINY_CHAT, Server

LIMIT = 12 << 20  # the server's --max-request-bytes: a 10 MB request fits, 13 MB does not
MAX_MODEL_LEN = 512
MAX_TOKEN_BYTES = 16  # the longest token of tiny-chat's tokenizer.json (an added token) in bytes
BIG = 10 * 1000 * 1000


@pytest.fixture(scope="module")
def front():
    s = Server(["--model", str(TINY_CHAT), "--device", "cpu", "--served-model-name", "tiny",
                "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "8", "--max-request-bytes", "12MiB"], "front")
    yield s
    s.stop()


def raw(server, head: bytes, body_chunks=(), timeout=30):
    """Send a request head, then body chunks (stopping if the server closes); return (status, body)."""
    k = socket.create_connection(("127.0.0.1", server.port), timeout=timeout)
    k.sendall(head)
    try:
        for c in body_chunks:
            k.sendall(c)
    except (BrokenPipeError, ConnectionResetError):
        pass
    data = b""
    try:
        while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < content_length(data):
            got = k.recv(65536)
            if not got:
                break
            data += got
    except ConnectionResetError:
        pass
    k.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


def content_length(data: bytes) -> int:
    for line in data.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 1 << 60


def chat_body(content: str, **kw) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 4, **kw}


def test_413_on_content_length_before_reading(front):
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/responses"):
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {LIMIT + 1}\r\n\r\n"
        status, body = raw(front, head.encode())  # no body sent: refused on the header alone
        assert status == 413
        e = json.loads(body)["error"]
        assert e["code"] == 413 and str(LIMIT) in e["message"] and "--max-request-bytes" in e["message"]
    head = f"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {LIMIT + 1}\r\n\r\n"
    status, body = raw(front, head.encode())
    assert status == 413
    v = json.loads(body)
    assert v["type"] == "error" and v["error"]["type"] == "request_too_large"


def chunked(total: int, piece: int = 1 << 20):
    sent = 0
    while sent < total:
        n = min(piece, total - sent)
        yield f"{n:x}\r\n".encode() + b" " * n + b"\r\n"
        sent += n
    yield b"0\r\n\r\n"


def test_413_on_chunked_body_over_the_limit(front):
    for path, anthropic in (("/v1/chat/completions", False), ("/v1/messages/count_tokens", True)):
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        status, body = raw(front, head.encode(), chunked(LIMIT + (1 << 20)))
        assert status == 413
        v = json.loads(body)
        assert (v["error"]["type"] == "request_too_large") if anthropic else (v["error"]["code"] == 413)
    assert requests.get(front.url + "/health", timeout=5).status_code == 200


def test_chunked_body_under_the_limit_works(front):
    body = json.dumps(chat_body("Hello there", temperature=0)).encode()
    plain = requests.post(front.url + "/v1/chat/completions", data=body, headers={"content-type": "application/json"})
    # requests sends a generator as Transfer-Encoding: chunked (no Content-Length).
    r = requests.post(front.url + "/v1/chat/completions", data=(body[i:i + 7] for i in range(0, len(body), 7)),
                      headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == plain.json()["choices"][0]["message"]["content"]


def test_prompt_cap_per_completions_request(front):
    r = requests.post(front.url + "/v1/completions", json={"model": "tiny", "prompt": [[1, 2]] * 129, "max_tokens": 1})
    assert r.status_code == 400, r.text
    e = r.json()["error"]
    assert e["param"] == "prompt" and "129 prompts" in e["message"] and "at most 128" in e["message"]
    r = requests.post(front.url + "/v1/completions", json={"model": "tiny", "prompt": ["hi"] * 129, "max_tokens": 1})
    assert r.status_code == 400 and "at most 128" in r.json()["error"]["message"]
    r = requests.post(front.url + "/v1/completions", json={"model": "tiny", "prompt": [[1, 2]] * 128, "max_tokens": 1})
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 128


def test_early_length_check(front):
    unit = "hello world "
    bound = MAX_MODEL_LEN * MAX_TOKEN_BYTES
    # Just under the bound: tokenized, and refused with the exact count (vLLM's message).
    under = unit * ((bound - 200) // len(unit))
    r = requests.post(front.url + "/v1/chat/completions", json=chat_body(under))
    assert r.status_code == 400
    e = r.json()["error"]
    assert e["param"] == "input_tokens" and "at least" in e["message"] and "bytes of text" not in e["message"]
    # Far over: refused from its length alone, in the same shape.
    over = unit * (BIG // len(unit))
    t0 = time.time()
    r = requests.post(front.url + "/v1/chat/completions", json=chat_body(over))
    assert r.status_code == 400
    e = r.json()["error"]
    assert e["param"] == "input_tokens" and "maximum context length is 512 tokens" in e["message"]
    assert "bytes of text" in e["message"]
    assert time.time() - t0 < 20
    # The refusal is right: the same text's real token count (count_tokens on a part of it that
    # fits under the bound, scaled) is over the context too.
    n = requests.post(front.url + "/v1/messages/count_tokens",
                      json={"model": "tiny", "messages": [{"role": "user", "content": unit * 100}]}).json()["input_tokens"]
    assert n * (len(over) // (len(unit) * 100)) > MAX_MODEL_LEN
    r = requests.post(front.url + "/v1/completions", json={"model": "tiny", "prompt": over, "max_tokens": 1})
    assert r.status_code == 400 and "bytes of text" in r.json()["error"]["message"]
    r = requests.post(front.url + "/v1/messages", json={"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": over}]})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def big_requests():
    """Two 10 MB requests: one long message, and many short ones (heavy JSON and template work)."""
    many = [{"role": "user" if i % 2 == 0 else "assistant", "content": "hi there %d" % i} for i in range(BIG // 40)]
    return [("/v1/chat/completions", json.dumps(chat_body("x" * BIG)).encode()),
            ("/v1/chat/completions", json.dumps({"model": "tiny", "messages": many, "max_tokens": 4}).encode())]


def test_large_requests_never_stall_the_server(front):
    bigs = big_requests()
    assert all(len(b) >= BIG for _, b in bigs)
    # A stream that runs through the whole test.
    body = json.dumps({"model": "tiny", "prompt": "Once upon a time", "max_tokens": 480, "stream": True,
                       "ignore_eos": True, "temperature": 0})
    k = socket.create_connection(("127.0.0.1", front.port), timeout=30)
    k.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n" + body).encode())
    arrivals, stop = [], threading.Event()

    def read_stream():
        while not stop.is_set():
            try:
                got = k.recv(65536)
            except OSError:  # closed by the test
                return
            if not got:
                return
            arrivals.extend([time.monotonic()] * got.count(b"data: "))

    reader = threading.Thread(target=read_stream)
    reader.start()
    while len(arrivals) < 3:
        time.sleep(0.01)
    statuses, health = [], []

    def send(path, data):
        statuses.append(requests.post(front.url + path, data=data, headers={"content-type": "application/json"}, timeout=120).status_code)

    senders = [threading.Thread(target=send, args=b) for b in bigs]
    t_start = time.monotonic()
    for t in senders:
        t.start()
    while any(t.is_alive() for t in senders):
        t0 = time.monotonic()
        assert requests.get(front.url + "/health", timeout=5).status_code == 200
        health.append(time.monotonic() - t0)
        time.sleep(0.02)
    t_end = time.monotonic()
    for t in senders:
        t.join()
    stop.set()
    k.close()
    reader.join(5)
    during = [b - a for a, b in zip(arrivals, arrivals[1:]) if b >= t_start and a <= t_end]
    print(f"slowest /health {max(health) * 1e3:.0f} ms, longest stream gap {max(during, default=0):.3f} s")
    assert statuses == [400, 400]
    assert len(health) >= 3, "the big requests finished too fast to observe anything"
    assert max(health) < 0.1, f"/health took {max(health):.3f} s while large requests were prepared"
    assert during, "the stream sent nothing while the large requests were prepared"
    assert max(during) < 0.5, f"the stream stalled {max(during):.2f} s between chunks"


def rss_kib(pid: int, key: str = "VmRSS") -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def test_memory_is_given_back_after_large_requests(front):
    """RSS after four 10 MB requests returns to within 24 MiB of what it was before them.

    Each request allocates several copies of its 10 MB (the body, the parsed JSON, the request, the
    rendered prompt), so the peak is far higher (checked, so the test has teeth). What may stay:
    the pool threads' stacks and arena headers, and pages the allocator cannot give back because a
    small live allocation sits in them; 24 MiB covers that with room and is well below one request's
    copies (glibc kept 1-2 GB without trimming)."""
    pid = front.proc.pid
    requests.post(front.url + "/v1/chat/completions", json=chat_body("warm up"))
    before = rss_kib(pid)
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM, so the peak below is these requests' own
    for _ in range(2):
        threads = [threading.Thread(target=requests.post, args=(front.url + p,), kwargs={"data": b}) for p, b in big_requests()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    time.sleep(0.5)
    after, peak = rss_kib(pid), rss_kib(pid, "VmHWM")
    print(f"RSS {before} KiB before, peak {peak} KiB, {after} KiB after")
    assert peak - before > 40 * 1024, f"peak {peak} KiB vs {before} KiB: the requests did not allocate what they should"
    assert after - before < 24 * 1024, f"RSS {before} KiB -> {after} KiB after large requests (peak {peak} KiB)"
