"""OpenAI error objects with vLLM's statuses, types and wording."""
import openai
import pytest
import requests

from conftest import TINY_CHAT, Server


def post(server, path, **kw):
    return requests.post(server.url + path, **kw)


def check(r, status, kind, param=None, contains=None):
    assert r.status_code == status, r.text
    e = r.json()["error"]
    assert set(e) == {"message", "type", "param", "code"}
    assert e["type"] == kind and e["code"] == status
    if param is not None:
        assert e["param"] == param
    if contains:
        assert contains in e["message"], e["message"]
    return e


def test_malformed_json(tiny):
    check(post(tiny, "/v1/chat/completions", data="{not json", headers={"content-type": "application/json"}), 400, "BadRequestError")
    check(post(tiny, "/v1/completions", data="[1,2]"), 400, "BadRequestError")


def test_wrong_types(tiny):
    check(post(tiny, "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}), 400, "BadRequestError")
    check(post(tiny, "/v1/chat/completions", json={"messages": "hi"}), 400, "BadRequestError")
    check(post(tiny, "/v1/completions", json={"prompt": {"x": 1}}), 400, "BadRequestError")


def test_wrong_model(tiny):
    e = check(post(tiny, "/v1/chat/completions", json={"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]}), 404, "NotFoundError")
    assert e["message"] == "The model `gpt-4` does not exist."
    with pytest.raises(openai.NotFoundError):
        openai.OpenAI(base_url=tiny.url + "/v1", api_key="x").completions.create(model="nope", prompt="hi", max_tokens=1)


def test_empty_messages_negative_max_tokens_and_n(tiny):
    check(post(tiny, "/v1/chat/completions", json={"messages": []}), 400, "BadRequestError", contains="messages")
    check(post(tiny, "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": -5}), 400, "BadRequestError", contains="max_tokens")
    check(post(tiny, "/v1/completions", json={"prompt": "hi", "max_tokens": -1}), 400, "BadRequestError")
    check(post(tiny, "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "n": 2}), 400, "BadRequestError", param="n")
    check(post(tiny, "/v1/chat/completions", json={"messages": [{"role": "wizard", "content": "hi"}]}), 400, "BadRequestError")
    with pytest.raises(openai.BadRequestError):
        openai.OpenAI(base_url=tiny.url + "/v1", api_key="x").chat.completions.create(model="tiny", messages=[], max_tokens=1)


def test_context_length_message(tiny):
    r = post(tiny, "/v1/completions", json={"prompt": [2, 40, 41, 42, 43], "max_tokens": 600})
    e = check(r, 400, "BadRequestError", param="input_tokens")
    assert e["message"] == (
        "This model's maximum context length is 512 tokens. However, you requested 600 output tokens and your prompt "
        "contains at least 5 input tokens, for a total of at least 605 tokens. Please reduce the length of the input "
        "prompt or the number of requested output tokens. (parameter=input_tokens, value=5)")
    r = post(tiny, "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10000})
    check(r, 400, "BadRequestError", param="input_tokens", contains="maximum context length is 512 tokens")


def test_not_found_route(tiny):
    r = requests.get(tiny.url + "/v1/nothing")
    check(r, 404, "NotFoundError")


def test_api_key():
    if not (TINY_CHAT / "config.json").exists():
        pytest.skip("tiny-chat fixture missing")
    s = Server(["--model", str(TINY_CHAT), "--device", "cpu", "--api-key", "sekret", "--served-model-name", "tiny"], "apikey")
    try:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        check(requests.post(s.url + "/v1/chat/completions", json=body), 401, "AuthenticationError")
        check(requests.post(s.url + "/v1/chat/completions", json=body, headers={"Authorization": "Bearer wrong"}), 401, "AuthenticationError")
        assert requests.post(s.url + "/v1/chat/completions", json=body, headers={"Authorization": "Bearer sekret"}).status_code == 200
        assert requests.get(s.url + "/v1/models").status_code == 401
        assert requests.get(s.url + "/health").status_code == 200  # health and metrics stay open, as in vLLM
        assert requests.get(s.url + "/metrics").status_code == 200
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="sekret")
        assert c.chat.completions.create(model="tiny", messages=body["messages"], max_tokens=1).choices
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=s.url + "/v1", api_key="bad").models.list()
    finally:
        s.stop()


def test_port_in_use_is_a_clear_error(tiny):
    import subprocess
    from conftest import laguna_bin
    p = subprocess.run([laguna_bin(), "serve", "--model", str(TINY_CHAT), "--device", "cpu", "--port", str(tiny.port)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert "already in use" in p.stderr, p.stderr


def test_503_when_the_model_cannot_load(tmp_path):
    """The port is bound before the weights load; while they cannot be served, /health and the API say 503."""
    import shutil
    import time
    if not (TINY_CHAT / "config.json").exists():
        pytest.skip("tiny-chat fixture missing")
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]:
        shutil.copy(TINY_CHAT / f, tmp_path / f)
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")

    class Unhealthy(Server):
        def wait_healthy(self, timeout=60):
            t0 = time.time()
            while time.time() - t0 < timeout:
                try:
                    requests.get(self.url + "/health", timeout=2)
                    return
                except requests.RequestException:
                    time.sleep(0.1)

    s = Unhealthy(["--model", str(tmp_path), "--device", "cpu", "--served-model-name", "tiny"], "broken")
    try:
        t0 = time.time()
        while "failed to load" not in check(requests.get(s.url + "/health"), 503, "ServiceUnavailableError")["message"]:
            assert time.time() - t0 < 30, "the load failure was never reported"
            time.sleep(0.05)
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        check(requests.post(s.url + "/v1/chat/completions", json=body), 503, "ServiceUnavailableError", contains="failed to load")
        assert requests.get(s.url + "/metrics").status_code == 200
    finally:
        s.stop()
