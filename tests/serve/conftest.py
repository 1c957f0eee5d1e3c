"""Start the real `laguna` binary on an ephemeral port with a tiny fixture model.

LAGUNA_BIN overrides the binary (default: target/debug/laguna, built by `cargo build`)."""
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "tests" / "fixtures" / "models"
TINY_CHAT = MODELS / "tiny-chat"
SCRIPTED_TOOL = MODELS / "scripted-tool"


_built = False


def laguna_bin() -> str:
    """LAGUNA_BIN, else target/debug/laguna, brought up to date with `cargo build` once per session."""
    global _built
    if os.environ.get("LAGUNA_BIN"):
        b = os.environ["LAGUNA_BIN"]
    else:
        b = str(ROOT / "target" / "debug" / "laguna")
        if not _built and os.environ.get("LAGUNA_SKIP_BUILD") != "1":
            p = subprocess.run(["cargo", "build", "-p", "laguna-cli"], cwd=ROOT, capture_output=True, text=True)
            if p.returncode != 0:
                pytest.exit(f"cargo build -p laguna-cli failed:\n{p.stderr[-4000:]}", returncode=2)
            _built = True
    if not Path(b).exists():
        pytest.exit(f"{b} does not exist: run `cargo build` first or set LAGUNA_BIN", returncode=2)
    return b


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, args, name):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"laguna-serve-{name}-{self.port}.log"
        self.log = open(self.log_path, "wb")
        cmd = [laguna_bin(), "serve", "--host", "127.0.0.1", "--port", str(self.port), *args]
        env = dict(os.environ, RUST_LOG=os.environ.get("RUST_LOG", "info"))
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.wait_healthy()

    def wait_healthy(self, timeout=120):
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.logs()}")
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server not healthy after {timeout}s:\n{self.logs()}")

    def logs(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def _need(path: Path):
    if not (path / "config.json").exists():
        pytest.skip(f"fixture {path} is missing (tests/fixtures/make_fixtures.py makes it)")


@pytest.fixture(scope="session")
def tiny():
    _need(TINY_CHAT)
    s = Server(["--model", str(TINY_CHAT), "--device", "cpu", "--served-model-name", "tiny", "--max-model-len", "512",
                "--max-num-seqs", "8", "--max-num-batched-tokens", "96"], "tiny")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def scripted():
    _need(SCRIPTED_TOOL)
    s = Server(["--model", str(SCRIPTED_TOOL), "--device", "cpu", "--served-model-name", "scripted"], "scripted")
    yield s
    s.stop()


def metric(text: str, name: str, **labels) -> float:
    """Value of one Prometheus sample (labels must all match)."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        if head.split("{")[0] != name:
            continue
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            return float(value)
    raise KeyError(f"{name} {labels} not in metrics")
