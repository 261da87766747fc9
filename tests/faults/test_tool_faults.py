"""Tools that return too much or end the process, met by the real `grpo train`.

A random tiny model never writes a tool call, so these runs use one that always does: the tiny
model with three added tokens (``<tool_call>``, the call's JSON, ``</tool_call>``) whose weights
make it a bigram chain: after the generation prompt's last token it writes those three, then
EOS, every turn, whatever the context (attention and MLP outputs zeroed; the margin is large
enough that a few training steps do not move it). Each test writes the tool to a temp file and
names it in the recipe as ``file.py:function``.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import time
from pathlib import Path

import pytest
import torch
from cli_runner import run_grpo
from tiny_runs import TINY_MODEL

#: The call the model writes, as one token each (the tool's name is the test's).
CALL = ("<tool_call>", '{"name": "%s", "arguments": {}}', "</tool_call>")
BUDGET = 256  # generation.max_completion_length: model and tool tokens together

TOOLS = '''
import os
import sys


def big() -> str:
    """Return ten megabytes of text."""
    return "x" * (10 * 2**20)


def bye() -> str:
    """End the process with sys.exit(3)."""
    sys.exit(3)


def bye_hard() -> str:
    """End the process with os._exit(4)."""
    os._exit(4)
'''


def caller_model(out: Path, tool: str) -> Path:
    """The tiny model, saved to `out`, that calls `tool` (no arguments) at every turn (see above)."""
    from tokenizers import AddedToken

    from grpocli.models import load_policy, load_tokenizer
    from grpocli.models.export import save_model
    from grpocli.recipe import load_recipe

    recipe = load_recipe("quickstart", TINY_MODEL).recipe
    tok, model = load_tokenizer(recipe.model), load_policy(recipe.model, 0)
    pieces = [CALL[0], CALL[1] % tool, CALL[2]]
    tok.add_tokens([AddedToken(p, normalized=False, special=False) for p in pieces])
    model.resize_token_embeddings(len(tok), mean_resizing=False)
    chain = [tok.convert_tokens_to_ids("Ċ"), *tok.convert_tokens_to_ids(pieces), tok.eos_token_id]  # "\n" first
    with torch.no_grad():
        model.config.tie_word_embeddings = False
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.norm.weight.fill_(1.0)
        embed, head = model.get_input_embeddings().weight, torch.zeros(model.lm_head.weight.shape)
        for k, (token, successor) in enumerate(itertools.pairwise(chain)):
            embed[token].zero_()
            embed[token, k] = 1.0
            head[successor, k] = 10.0  # logit ~57 after the norm: nothing else is ever sampled
        model.lm_head.weight = torch.nn.Parameter(head)
    return save_model(model, tok, out)


@pytest.fixture
def tools_file(tmp_path: Path) -> Path:
    path = tmp_path / "bad_tools.py"
    path.write_text(TOOLS)
    return path


def _train(model: Path, tools: Path, tool: str, out: Path, *extra: str, timeout: float = 240):
    return run_grpo(
        "train", "quickstart", f"model.name_or_path={model}", f"generation.max_completion_length={BUDGET}",
        "generation.num_generations=2", "train.prompts_per_step=2", "train.micro_batch_size=4", "train.steps=1",
        "log.progress=none", "log.rollouts_every=1", "data.args={num_samples=16}", "multi_turn.max_turns=2",
        f'tools=[{{name="{tools}:{tool}"}}]', f"train.output_dir={out}", *extra, timeout=timeout)


def _rollouts(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "rollouts" / "step-1.jsonl").read_text().splitlines()]


def _metrics(out: Path) -> dict:
    return json.loads((out / "metrics.jsonl").read_text().splitlines()[0])


@pytest.mark.slow
def test_a_tool_returning_10_mb_is_cut_to_the_budget_before_tokenizing(tools_file, tmp_path):
    model = caller_model(tmp_path / "model", "big")
    started = time.monotonic()
    try:  # tokenizing 10 MB takes tens of seconds a call (4 calls here); cut first, it takes none
        done = _train(model, tools_file, "big", tmp_path / "run", timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("the run did not end within 120 s")
    assert done.returncode == 0, done.stderr[-3000:]
    assert time.monotonic() - started < 90
    rows = _rollouts(tmp_path / "run")
    assert len(rows) == 4
    for row in rows:
        tool = [m for m in row["conversation"] if m["role"] == "tool"]
        assert len(tool) == 1, row["conversation"]  # spliced in, cut, instead of dropped
        content = tool[0]["content"]
        assert content.startswith("xxxx") and len(content) < BUDGET, content
        assert content.endswith(f"of {10 * 2**20} characters kept]"), content
        assert "[grpo cut this tool result to fit generation.max_completion_length:" in content, content


@pytest.mark.slow
@pytest.mark.parametrize("tool, called", [("bye", "sys.exit(3)"), ("bye_hard", "os._exit(4)")])
def test_a_tool_that_ends_the_process_is_an_error_naming_it_at_once(tools_file, tmp_path, tool, called):
    model = caller_model(tmp_path / "model", tool)
    done = _train(model, tools_file, tool, tmp_path / "run", "multi_turn.tool_timeout=60")
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
    metrics = _metrics(tmp_path / "run")
    assert metrics["tools/timeouts"] == 0 and metrics["tools/errors"] > 0, metrics
    assert metrics["time/generation"] < 30, metrics  # not the 60 s timeout of each call
    for row in _rollouts(tmp_path / "run"):
        tool_messages = [m for m in row["conversation"] if m["role"] == "tool"]
        assert tool_messages, row["conversation"]
        assert tool_messages[0]["content"].startswith(f"Error: the tool {tool!r} called {called}"), tool_messages
    assert f"warning: the tool {tool!r} called {called}" in done.stderr, done.stderr[-3000:]
    assert done.stderr.count(f"warning: the tool {tool!r}") == 1, done.stderr[-3000:]  # once, not per call
