"""`laguna serve --draft`: DFlash speculative decoding through the scheduler gives the same greedy
tokens as serving without the draft, and the spec-decode counters move."""
import shutil

import pytest
import requests

from conftest import MODELS, ROOT, TINY_CHAT, Server, metric

TARGET = MODELS / "swa-yarn-perhead"
DRAFT = ROOT / "tests" / "fixtures" / "drafts" / "swa-yarn-perhead-causal-w8"


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    if not (TARGET / "config.json").exists() or not (DRAFT / "config.json").exists() or not (TINY_CHAT / "tokenizer.json").exists():
        pytest.skip("DFlash fixtures missing")
    d = tmp_path_factory.mktemp("target")
    for f in ["config.json", "model.safetensors"]:
        shutil.copy(TARGET / f, d / f)
    shutil.copy(TINY_CHAT / "tokenizer.json", d / "tokenizer.json")  # the fixture has none; ids stay below its vocab
    return d


def test_draft_serving_matches_plain(target_dir):
    prompts = [[(i * 31 + j * 7 + 3) % 384 for j in range(6 + 3 * i)] for i in range(4)]
    outs = {}
    for mode, extra in (("plain", []), ("dflash", ["--draft", str(DRAFT), "--num-speculative-tokens", "3"])):
        s = Server(["--model", str(target_dir), "--device", "cpu", "--served-model-name", "t", "--max-num-batched-tokens", "16", *extra], mode)
        try:
            r = requests.post(s.url + "/v1/completions", json={"prompt": prompts, "max_tokens": 20, "temperature": 0, "ignore_eos": True})
            assert r.status_code == 200, r.text
            outs[mode] = [c["text"] for c in r.json()["choices"]]
            assert r.json()["usage"]["completion_tokens"] == 80
            m = requests.get(s.url + "/metrics").text
            drafts = metric(m, "vllm:spec_decode_num_drafts_total", model_name="t")
            assert (drafts > 0) == (mode == "dflash"), (mode, drafts)
            if mode == "dflash":
                assert "DFlash draft loaded" in s.logs()
        finally:
            s.stop()
    assert outs["dflash"] == outs["plain"]


def test_auto_k_serving_matches_plain(target_dir):
    """`--num-speculative-tokens auto`: the step-time table is measured at load (logged), the
    controller picks k per step, greedy output equals the no-draft server's, and /metrics shows
    the chosen k."""
    prompts = [[(i * 13 + j * 5 + 1) % 384 for j in range(5 + 2 * i)] for i in range(3)]
    outs = {}
    for mode, extra in (("plain", []), ("auto", ["--draft", str(DRAFT), "--num-speculative-tokens", "auto"])):
        s = Server(["--model", str(target_dir), "--device", "cpu", "--served-model-name", "t",
                    "--max-num-seqs", "2", "--max-num-batched-tokens", "32", *extra], f"dflash-{mode}")
        try:
            r = requests.post(s.url + "/v1/completions", json={"prompt": prompts, "max_tokens": 24, "temperature": 0, "ignore_eos": True})
            assert r.status_code == 200, r.text
            outs[mode] = [c["text"] for c in r.json()["choices"]]
            m = requests.get(s.url + "/metrics").text
            if mode == "auto":
                logs = s.logs()
                # The fixture's real context (128 positions) fits measuring k <= 14 (StepCosts::fit).
                assert "128-position context fits measuring k <= 14" in logs, logs
                assert "adaptive k: step ms at k = 0..=14, 7-token prompt" in logs, logs
                assert "k = auto, at most 15" in logs, logs
                k = metric(m, "laguna:spec_k", model_name="t")
                assert 0 <= k <= 14, k
                steps = [float(l.rpartition(" ")[2]) for l in m.splitlines() if l.startswith("laguna:spec_k_steps_total{")]
                assert sum(steps) > 0, m
        finally:
            s.stop()
    assert outs["auto"] == outs["plain"]


def test_auto_k_fits_a_short_context(target_dir):
    """`auto` with a context too short for the full measurement: 40 positions measure k <= 3
    beside a 7-token prompt, 16 positions not even k = 1 (the controller decodes, k = 0); both
    load, log what they gave up and serve the no-draft server's greedy tokens."""
    prompt = [(j * 11 + 2) % 384 for j in range(5)]
    outs = {}
    for mode, extra in (("plain", ["--max-model-len", "16"]),
                        ("auto40", ["--max-model-len", "40", "--draft", str(DRAFT), "--num-speculative-tokens", "auto"]),
                        ("auto16", ["--max-model-len", "16", "--draft", str(DRAFT), "--num-speculative-tokens", "auto"])):
        s = Server(["--model", str(target_dir), "--device", "cpu", "--served-model-name", "t", *extra], f"dflash-{mode}")
        try:
            r = requests.post(s.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 10, "temperature": 0, "ignore_eos": True})
            assert r.status_code == 200, r.text
            outs[mode] = r.json()["choices"][0]["text"]
            logs = s.logs()
            if mode == "auto40":
                assert "40-position context fits measuring k <= 3" in logs, logs
                assert "adaptive k: step ms at k = 0..=3, 7-token prompt" in logs, logs
            if mode == "auto16":
                assert "16-position context leaves no room to measure a drafting step" in logs, logs
                m = requests.get(s.url + "/metrics").text
                assert metric(m, "laguna:spec_k", model_name="t") == 0
                assert metric(m, "vllm:spec_decode_num_drafts_total", model_name="t") == 0
        finally:
            s.stop()
    assert outs["auto40"] == outs["plain"]
    assert outs["auto16"] == outs["plain"]


def test_bad_num_speculative_tokens_is_refused(target_dir):
    for bad in ["fast", "0"]:
        with pytest.raises(RuntimeError, match="num-speculative-tokens"):
            Server(["--model", str(target_dir), "--device", "cpu", "--draft", str(DRAFT), "--num-speculative-tokens", bad], f"bad-k-{bad}")
