"""Real models' shapes as `model.tiny.*` overrides: a model built from a config at that shape, with
random weights and the built-in character tokenizer padded to the model's vocabulary (filler
tokens), so a benchmark needs no download and no weights on disk.

    python -m grpocli.benchmark.presets qwen2.5-0.5b             # prints the overrides, one a line
    python -m grpocli.benchmark.presets qwen2.5-0.5b quickstart  # and data.max_prompt_length=<longest prompt>

With a recipe, `data.max_prompt_length` is cut to the recipe's longest prompt under that tokenizer,
so that `grpo plan` (which plans every prompt at that length) and `grpo bench` (whose rows are as
wide as their longest prompt) describe the same step: at the default 512 the plan of the 0.5B shape
on quickstart (25-token prompts) was 1.8x the measured peak.
"""

from __future__ import annotations

import sys

#: Qwen2.5 base shapes (their config.json; tied embeddings, as the tiny model).
SHAPES: dict[str, dict[str, int]] = {
    "qwen2.5-0.5b": dict(hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2, intermediate_size=4864,
                         vocab_size=151936, max_position_embeddings=4096),
    "qwen2.5-1.5b": dict(hidden_size=1536, num_layers=28, num_heads=12, num_kv_heads=2, intermediate_size=8960,
                         vocab_size=151936, max_position_embeddings=4096),
    # a CPU-sized stand-in with the same parts (grouped-query attention, a padded vocabulary): tests
    "cpu-tiny": dict(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128,
                     vocab_size=512, max_position_embeddings=1024),
}


def shape_overrides(name: str) -> list[str]:
    """`model.name_or_path=tiny` and the shape's `model.tiny.*` keys."""
    if name not in SHAPES:
        from grpocli.errors import UserError

        raise UserError(f"unknown model shape {name!r}", valid=", ".join(SHAPES))
    return ["model.name_or_path=tiny", *(f"model.tiny.{k}={v}" for k, v in SHAPES[name].items())]


def longest_prompt(recipe: str, overrides: list[str]) -> int:
    """Tokens of the recipe's longest prompt as the policy sees it (chat template applied), at most
    its data.max_prompt_length."""
    from grpocli.data.source import load_dataset_for
    from grpocli.data.template import render_row
    from grpocli.models import load_tokenizer
    from grpocli.recipe import load_recipe
    from grpocli.registry import load_plugins

    r = load_recipe(recipe, overrides).recipe
    dataset = load_dataset_for(r.data, load_plugins().datasets, r.data.split, r.train.seed)
    tokenizer = load_tokenizer(r.model)
    texts = [render_row(row, r.data, tokenizer)["prompt_text"] for row in dataset]
    longest = max(len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"])
    return min(longest, r.data.max_prompt_length)


if __name__ == "__main__":
    keys = shape_overrides(sys.argv[1] if len(sys.argv) > 1 else "qwen2.5-0.5b")
    if len(sys.argv) > 2:
        keys.append(f"data.max_prompt_length={longest_prompt(sys.argv[2], keys)}")
    print("\n".join(keys))
