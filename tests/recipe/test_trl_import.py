"""`grpo import trl`: a TRL config trains in grpo as in TRL's own GRPOTrainer.

For each config, TRL 1.16's GRPOTrainer and `train` of the imported recipe run on one tiny model
saved to a folder; one reward function records the optimizer step at each generation round and a
TRL callback the learning rate of each optimizer step. Rounds, steps per round and the learning
rate at every step must agree.
"""

from __future__ import annotations

import json
import sys

import pytest
from cli_runner import run_grpo

from grpocli.errors import UserError
from grpocli.recipe.trl_import import convert

REWARD = '''
SEEN = []

def count(completions, trainer_state, **kwargs):
    SEEN.append(trainer_state.global_step)
    return [float(len(str(c))) for c in completions]
'''

#: Tiny and fast on both sides; these fields go through the import as any other.
COMMON = {"per_device_train_batch_size": 2, "num_generations": 2, "max_completion_length": 4, "bf16": False,
          "gradient_checkpointing": False, "learning_rate": 1e-3, "reward_funcs": ["trl_import_reward.count"]}
CONFIGS = {
    "accum4-mu2-cosine-warmup": {"gradient_accumulation_steps": 4, "num_iterations": 2, "max_steps": 5,
                                 "lr_scheduler_type": "cosine", "warmup_steps": 2},
    "accum2-spg4-mu2-warmup-ratio": {"gradient_accumulation_steps": 2, "steps_per_generation": 4,
                                     "num_iterations": 2, "max_steps": 6, "warmup_steps": 0.25},
    "accum1-spg2-constant-warmup": {"steps_per_generation": 2, "max_steps": 4,
                                    "lr_scheduler_type": "constant_with_warmup", "warmup_steps": 1},
}


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    from grpocli.models.tiny import build_tiny_model
    from grpocli.models.tokenizer import build_char_tokenizer
    from grpocli.recipe.schema import TinyModel

    folder = tmp_path_factory.mktemp("tiny-model")
    tokenizer = build_char_tokenizer()
    build_tiny_model(TinyModel(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64), tokenizer,
                     seed=0).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture
def reward_module(tmp_path, monkeypatch):
    (tmp_path / "trl_import_reward.py").write_text(REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    import trl_import_reward

    yield trl_import_reward
    sys.modules.pop("trl_import_reward", None)


def _trl_run(fields, model_dir, out, reward):
    """TRL's own trainer: generation rounds (as global steps) and the lr of each optimizer step."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    lrs = []

    class LearningRates(TrainerCallback):
        def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
            lrs.append(optimizer.param_groups[0]["lr"])

    args = {k: v for k, v in fields.items() if k != "reward_funcs"}
    config = GRPOConfig(output_dir=str(out), report_to="none", save_strategy="no", logging_steps=1,
                        use_cpu=True, disable_tqdm=True, **args)
    data = Dataset.from_list([{"prompt": f"{a}+{b}="} for a in range(8) for b in range(8)])
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=reward.count, args=config, train_dataset=data,
                          callbacks=[LearningRates()])
    reward.SEEN.clear()
    trainer.train()
    return list(reward.SEEN), lrs


def _grpo_run(fields, model_dir, tmp_path, reward):
    from grpocli.recipe import load_recipe
    from grpocli.trainer.loop import train

    out = tmp_path / "trl.yaml"
    out.write_text(json.dumps({**fields, "model_name_or_path": str(model_dir)}))
    recipe = tmp_path / "imported.toml"
    result = run_grpo("import", "trl", str(out), "-o", str(recipe))
    assert result.returncode == 0, result.stderr
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+{b}="}) + "\n" for a in range(8) for b in range(8)))
    reward.SEEN.clear()
    run = tmp_path / "grpo-run"
    train(load_recipe(str(recipe), [f"data.dataset='{data}'", f"train.output_dir='{run}'", "log.progress=none",
                                    "log.rollouts_every=0", "train.save_steps=0", "train.torch_threads=1"]))
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return list(reward.SEEN), [m["learning_rate"] for m in metrics], result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CONFIGS))
def test_imported_recipe_trains_as_trl(name, tiny_model_dir, reward_module, tmp_path):
    pytest.importorskip("trl", reason="TRL is not installed (pip install 'grpocli[bench]')")
    fields = {**COMMON, **CONFIGS[name]}
    trl_rounds, trl_lrs = _trl_run(fields, tiny_model_dir, tmp_path / "trl-run", reward_module)
    grpo_rounds, grpo_lrs, printed = _grpo_run(fields, tiny_model_dir, tmp_path, reward_module)
    assert grpo_rounds == trl_rounds, printed  # the optimizer step at which each round generated
    assert len(grpo_lrs) == len(trl_lrs) == fields["max_steps"]
    assert grpo_lrs == pytest.approx(trl_lrs, rel=1e-9, abs=1e-15), printed
