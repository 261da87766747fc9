"""A real tiny model that ends its turns after a few tokens, and the turn loop around it, for the
tests of tests/multiturn (a module, as tests/tiny_runs.py, so both test files import it).

A randomly initialised tiny model almost never writes EOS (1 token in 104), so its turns would
all run into the budget. `chatty` changes its weights (a real model still, run by transformers and
vLLM alike) so that EOS wins whenever one hidden direction is positive: turns of a few tokens.
Tool calls: the test parser reads every turn as a call of `echo` (the model cannot write JSON), so
that every rollout goes through several turns; the hermes parser is tested on text.
"""

from __future__ import annotations

from typing import Any

import torch

from grpocli.generation.base import Sampling
from grpocli.multiturn.parsers import ToolCall
from grpocli.multiturn.toolbox import Toolbox, tool_from_function
from grpocli.multiturn.turns import TurnLoop

#: Head size 32: vLLM's CPU attention takes it.
TINY = {"hidden_size": 64, "num_layers": 2, "num_heads": 2, "intermediate_size": 128}
ROWS = [{"prompt": "12+7=", "answer": 19}, {"prompt": "3*4=", "answer": 12}]
SAMPLING = Sampling(max_tokens=200, temperature=1.0)  # each turn: the budget left


def echo(text: str) -> str:
    """Repeat the start of a text.

    Args:
        text: What to repeat.
    """
    return f"echo:{text[:4]}"


def recipe(*extra: str) -> Any:
    from grpocli.recipe import load_recipe

    overrides = [f"model.tiny.{k}={v}" for k, v in TINY.items()] + [
        'tools=[{name="calculator"}]', "generation.num_generations=3", "generation.max_completion_length=200",
        "multi_turn.max_turns=4", "data.max_prompt_length=512", "algorithm.beta=0.0", "log.progress='none'", *extra]
    return load_recipe(None, overrides).recipe


def chatty_model(r: Any) -> tuple[Any, Any]:
    """The tiny policy and tokenizer, its weights changed to end turns after a few tokens."""
    from grpocli.models import load_policy, load_tokenizer

    tok = load_tokenizer(r.model)
    model = load_policy(r.model, 0)
    with torch.no_grad():
        norm = model.model.norm.weight
        norm.zero_()
        norm[0] = 1.0                                   # logits = h[0] * W[:, 0], h[0] ~ N(0, 1)
        model.config.tie_word_embeddings = False        # an output matrix of its own
        w = torch.rand(model.lm_head.weight.shape, generator=torch.Generator().manual_seed(0)) - 0.5
        w[tok.eos_token_id, 0] = 3.0                    # likely whenever h[0] is clearly > 0
        model.lm_head.weight = torch.nn.Parameter(w)
    model.generation_config.eos_token_id = [tok.eos_token_id]  # a turn ends at <|im_end|> only
    return model, tok


def echo_loop(r: Any, tok: Any, *tools: Any, parallel: Any = None) -> TurnLoop:
    """The turn loop with `echo` (and `tools`) where every turn is read as a call of the first of
    `tools` (else echo) with the turn's text (`parallel`: the processes' strategy, default one)."""
    box = Toolbox([tool_from_function(fn, "test") for fn in (echo, *tools)])
    loop = TurnLoop(box, tok, r, parallel)
    first = (tools[0].__name__ if tools else "echo")
    loop.parse = lambda text: [ToolCall(first, {"text": text})]
    loop.strip = lambda text: text
    return loop


def runs(mask: list[int]) -> list[tuple[int, int, int]]:
    """(value, start, end) of each run of equal values in a 0/1 mask."""
    out, start = [], 0
    for k in range(1, len(mask) + 1):
        if k == len(mask) or mask[k] != mask[start]:
            out.append((mask[start], start, k))
            start = k
    return out
