"""`grpo plan`: how much device memory each phase of a training step takes, from the model's
config and the recipe alone (no weights are loaded).

    shapes.py   the model's shape (ModelShape): from config.json, [model.tiny], a packaged or
                GGUF model's metadata, or a live model's config; parameter counts and linear layers
                exact (the model built on the meta device); `grpo bench` counts FLOPs from it too
    memory.py   the per-phase byte counts (generation, log-prob passes, training) as plain
                functions returning immutable `Phase` values
    engine_cache.py  the colocated vLLM engine's KV cache: the sequences it holds at once (in flight:
                several generation batches) and what its share leaves for them
    teacher.py  [distill]'s teacher's shape (none when it is served): its weights and pass are counted
    recipe_settings.py  a recipe in the memory model's terms; its peak, the largest micro-batch that fits
    plan.py     the plan of a recipe: the phases, the peak, whether it fits, the largest
                micro-batch that does, and the knobs that would make it fit
    report.py   the plan as rich tables or JSON
    autosize.py the "auto" sizes (micro-batch, token budget, gradient checkpointing) on a given memory
    headroom.py what the plan says of a bottleneck's remedies (grpocli.inspection.remedies): whether each
                changed recipe fits, the KV tokens a larger vLLM share buys, the bytes a sync sends;
                `grpo inspect RUN` and `grpo bench` print it

The trainer calls `check_fits` before it loads a model onto a GPU (train.memory_check).
"""

from __future__ import annotations

from grpocli.planning.memory import Phase, Settings
from grpocli.planning.plan import Plan, check_fits, make_plan
from grpocli.planning.shapes import ModelShape, shape_of, shape_of_config

__all__ = ["ModelShape", "Phase", "Plan", "Settings", "check_fits", "make_plan", "shape_of",
           "shape_of_config"]
