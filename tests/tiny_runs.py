"""Recipe overrides that make a real training run take seconds (a module, like cli_runner, so
test files in any folder can import it)."""

#: The tiny model's shape: 1 layer, hidden size 32.
TINY_MODEL = [
    "model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2",
    "model.tiny.intermediate_size=64",
]

#: A 2-step run: 4 prompts x 4 completions of at most 8 tokens, rollouts every step.
FAST = [
    *TINY_MODEL, "generation.max_completion_length=8", "generation.num_generations=4",
    "train.prompts_per_step=4", "train.steps=2", "train.micro_batch_size=4", "log.progress=none",
    "log.rollouts_every=1", "data.args={num_samples=64}",
]
