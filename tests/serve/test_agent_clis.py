"""Claude Code and Codex, the real CLIs, against `laguna serve`.

Each scenario runs in a loopback-only network namespace (`unshare -n`, then `ip link set lo up`):
this file re-runs itself there as a driver that starts the server, a recording proxy in front of it
(so the test sees exactly what the CLI sent and got) and the CLI. The CLIs come from npm
(scripts/ci-deps-serve.sh installs the pinned versions); the prompts are kept small (Claude Code's
--system-prompt / --tools, Codex's config) because the tiny test models have a 4096-token window.

The model is the scripted-tool fixture, served greedy: it ends every turn (EOS after a fixed chain)
where the random tiny-chat model runs to max_tokens, which both CLIs treat as an error. With tools
in the request that chain is a `get_weather` call; without, it is plain text."""
import http.client
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
from conftest import SCRIPTED_TOOL, Server, free_port, laguna_bin  # noqa: E402

BILLING = "x-anthropic-billing-header:"


# ------------------------------------------------------------------------------------------------
# the driver (runs inside the namespace)

class Recorder:
    """A reverse proxy that forwards to the server and records each request and response."""

    def __init__(self, upstream_port):
        self.records = []
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def _forward(self):
                n = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(n) if n else b""
                skip = {"host", "content-length", "accept-encoding", "connection"}
                headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
                c = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=300)
                c.request(self.command, self.path, body=body, headers=headers)
                r = c.getresponse()
                data = r.read()
                outer.records.append({"method": self.command, "path": self.path, "headers": dict(self.headers),
                                      "body": body.decode(errors="replace"), "status": r.status,
                                      "response": data.decode(errors="replace")})
                self.send_response(r.status)
                for k, v in r.getheaders():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(k, v)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_HEAD = do_DELETE = _forward

            def log_message(self, *a):
                pass

        self.port = free_port()
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), H)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


def sse_events(text):
    out = []
    for frame in text.split("\n\n"):
        for line in frame.split("\n"):
            if line.startswith("data: ") and line[6:] != "[DONE]":
                out.append(json.loads(line[6:]))
    return out


def scenario_env(tmp, proxy_url):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE_", "OPENAI_", "CODEX_"))}
    home = tmp / "home"
    home.mkdir(exist_ok=True)
    env.update(HOME=str(home), NO_COLOR="1")
    if proxy_url:
        env.update(ANTHROPIC_BASE_URL=proxy_url, ANTHROPIC_API_KEY="dummy-key",
                   CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", CLAUDE_CODE_MAX_OUTPUT_TOKENS="16")
    return env


CLAUDE_SMALL = ["--system-prompt", "You are a test assistant.", "--bare", "--no-session-persistence"]


def codex_home(tmp, port):
    h = tmp / "codex-home"
    h.mkdir(exist_ok=True)
    (h / "instructions.md").write_text("You are a test agent. Answer briefly.\n")
    (h / "config.toml").write_text(f"""model = "scripted"
model_provider = "laguna"
model_instructions_file = "{h / 'instructions.md'}"
include_permissions_instructions = false
include_apps_instructions = false
include_environment_context = false
web_search = "disabled"

[skills]
include_instructions = false

[tools]
experimental_request_user_input = {{ enabled = false }}

[agents]
enabled = false

[features]
goals = false
apps = false
memories = false
plugins = false
unified_exec = false
shell_tool = false
view_image = false

[model_providers.laguna]
name = "laguna"
base_url = "http://127.0.0.1:{port}/v1"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0
""")
    return h


def greedy_copy(model, tmp):
    """The fixture with `temperature: 0` in its generation_config.json: the CLIs send no temperature,
    so the server's default (the checkpoint's, as vLLM's --generation-config auto) makes them greedy."""
    dst = tmp / model.name
    dst.mkdir()
    for f in model.iterdir():
        if f.name != "generation_config.json":
            (dst / f.name).symlink_to(f)
    gen = json.loads((model / "generation_config.json").read_text())
    (dst / "generation_config.json").write_text(json.dumps(dict(gen, temperature=0.0)))
    return dst


def drive(scenario, tmp):
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    model = greedy_copy(SCRIPTED_TOOL, tmp)
    name = "scripted"
    server = Server(["--model", str(model), "--device", "cpu", "--served-model-name", name], f"cli-{scenario}")
    proxy = Recorder(server.port)
    url = f"http://127.0.0.1:{proxy.port}"
    result = {}
    try:
        if scenario.startswith("claude"):
            env = scenario_env(tmp, url)
            tools = ["--tools", "Read", "--max-turns", "2"] if scenario == "claude-tool" else ["--tools", ""]
            cmd = ["claude", "-p", "say hi", "--model", name, *CLAUDE_SMALL, *tools]
        else:
            env = scenario_env(tmp, None)
            env["CODEX_HOME"] = str(codex_home(tmp, proxy.port))
            cmd = ["codex", "exec", "--skip-git-repo-check", "say hi"]
        p = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True, timeout=150, stdin=subprocess.DEVNULL)
        result.update(rc=p.returncode, stdout=p.stdout, stderr=p.stderr[-4000:])
        if scenario == "claude-hi" and proxy.records:
            # the prefix-stability measurement: the billing block counts for nothing
            body = json.loads(proxy.records[0]["body"])
            without = dict(body, system=[b for b in body["system"] if not b["text"].startswith(BILLING)])
            counts = []
            for b in (body, without):
                r = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
                r.request("POST", "/v1/messages/count_tokens", body=json.dumps(b), headers={"content-type": "application/json"})
                counts.append(json.loads(r.getresponse().read())["input_tokens"])
            result["counts"] = counts
    finally:
        result["requests"] = proxy.records
        result["server_log"] = server.logs()[-4000:]
        server.stop()
        (tmp / "result.json").write_text(json.dumps(result))


# ------------------------------------------------------------------------------------------------
# the tests (run outside)

import pytest  # noqa: E402


def _skip_reason(cli):
    if shutil.which(cli) is None:
        if shutil.which("npm") is None:
            return f"npm is absent, so `{cli}` could not be installed (scripts/ci-deps-serve.sh installs it with npm)"
        pytest.fail(f"`{cli}` is not installed: run scripts/ci-deps-serve.sh (npm install -g of the pinned CLIs)")
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is absent: cannot bring up loopback in a network namespace"
    if subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode != 0:
        return "unshare -n is not permitted here (needs root or user namespaces)"
    return None


def run_scenario(scenario, cli, tmp_path):
    why = _skip_reason(cli)
    if why:
        pytest.skip(why)
    env = dict(os.environ, LAGUNA_BIN=laguna_bin())
    p = subprocess.run(["unshare", "-n", sys.executable, str(HERE), scenario, str(tmp_path)], env=env,
                       capture_output=True, text=True, timeout=240)
    out = tmp_path / "result.json"
    assert out.exists(), f"driver failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return json.loads(out.read_text())


def describe(res):
    return (f"rc={res.get('rc')}\nstdout:\n{res.get('stdout')}\nstderr:\n{res.get('stderr')}\n"
            f"requests: {[(r['method'], r['path'], r['status']) for r in res['requests']]}\nserver log:\n{res.get('server_log')}")


def test_claude_code_says_hi(tmp_path):
    res = run_scenario("claude-hi", "claude", tmp_path)
    assert res["rc"] == 0, describe(res)
    reqs = res["requests"]
    assert reqs and all(r["status"] == 200 for r in reqs), describe(res)
    msgs = [r for r in reqs if r["path"].startswith("/v1/messages")]
    assert msgs, describe(res)
    body = json.loads(msgs[-1]["body"])
    assert body["model"] == "scripted" and body["stream"] is True
    assert not body.get("tools")
    # what laguna streamed is what the CLI printed
    text = "".join(e["delta"]["text"] for e in sse_events(msgs[-1]["response"])
                   if e["type"] == "content_block_delta" and e["delta"]["type"] == "text_delta")
    assert res["stdout"].strip() == text.strip(), describe(res)
    # Claude Code's first system block is the volatile billing line; laguna drops it
    first = json.loads(msgs[0]["body"])["system"]
    if isinstance(first, list) and first and first[0]["text"].startswith(BILLING):
        assert res["counts"][0] == res["counts"][1]


def test_claude_code_tool_round_trip(tmp_path):
    res = run_scenario("claude-tool", "claude", tmp_path)
    msgs = [r for r in res["requests"] if r["path"].startswith("/v1/messages")]
    assert len(msgs) >= 2 and all(r["status"] == 200 for r in msgs), describe(res)
    events = sse_events(msgs[0]["response"])
    (start,) = [e for e in events if e["type"] == "content_block_start" and e["content_block"]["type"] == "tool_use"]
    call_id = start["content_block"]["id"]
    assert start["content_block"]["name"] == "get_weather"
    args = "".join(e["delta"]["partial_json"] for e in events
                   if e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta")
    assert json.loads(args) == {"city": "Paris"}
    # the CLI replayed the call and answered it with a tool_result for that id
    second = json.loads(msgs[1]["body"])["messages"]
    uses = [b for m in second if m["role"] == "assistant" and isinstance(m["content"], list)
            for b in m["content"] if b["type"] == "tool_use"]
    assert [(u["id"], u["name"], u["input"]) for u in uses] == [(call_id, "get_weather", {"city": "Paris"})]
    results = [b for m in second if m["role"] == "user" and isinstance(m["content"], list)
               for b in m["content"] if b.get("type") == "tool_result"]
    assert [r["tool_use_id"] for r in results] == [call_id], describe(res)


def test_codex_exec_completes_a_turn(tmp_path):
    res = run_scenario("codex-hi", "codex", tmp_path)
    assert res["rc"] == 0, describe(res)
    posts = [r for r in res["requests"] if r["method"] == "POST" and r["path"] == "/v1/responses"]
    assert posts and all(r["status"] == 200 for r in posts), describe(res)
    events = sse_events(posts[-1]["response"])
    assert events[-1]["type"] in ("response.completed", "response.incomplete")
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text.strip() and text.strip() in res["stdout"], describe(res)


if __name__ == "__main__":
    drive(sys.argv[1], Path(sys.argv[2]))
