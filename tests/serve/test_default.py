"""`laguna serve` without a model serves the embedded tiny test model on CPU."""
import requests

from conftest import Server


def test_embedded_default_model():
    s = Server([], "default")
    try:
        r = requests.post(s.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5})
        assert r.status_code == 200, r.text
        j = r.json()
        assert j["object"] == "chat.completion" and j["choices"][0]["message"]["role"] == "assistant"
        assert "tiny test model" in s.logs()
        m = requests.get(s.url + "/v1/models").json()["data"][0]
        assert m["id"] == "laguna-tiny-chat" and m["max_model_len"] > 0
    finally:
        s.stop()


def test_recipe():
    """`laguna serve --recipe R`: model, name and limits come from the recipe; flags override it."""
    from conftest import ROOT
    recipe = ROOT / "recipes" / "tiny-cpu.toml"
    if not recipe.exists():
        import pytest
        pytest.skip("recipes/tiny-cpu.toml is missing")
    s = Server(["--recipe", str(recipe)], "recipe")  # Server adds --host/--port, which beat the recipe's
    try:
        m = requests.get(s.url + "/v1/models").json()["data"][0]
        assert m["id"] == "laguna-tiny" and m["max_model_len"] == 4096
        r = requests.post(s.url + "/v1/chat/completions", json={"model": "laguna-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
        assert r.status_code == 200, r.text
        assert "tiny test model" not in s.logs()
    finally:
        s.stop()
