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
