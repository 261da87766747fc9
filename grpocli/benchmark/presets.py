"""Real models' shapes as `model.tiny.*` overrides: a model built from a config at that shape, with
random weights and the built-in character tokenizer padded to the model's vocabulary (filler
tokens), so a benchmark needs no download and no weights on disk.

    python -m grpocli.benchmark.presets qwen2.5-0.5b     # prints the overrides, one a line
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


if __name__ == "__main__":
    print("\n".join(shape_overrides(sys.argv[1] if len(sys.argv) > 1 else "qwen2.5-0.5b")))
