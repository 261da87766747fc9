"""`grpo import trl`: a TRL config trains in grpo as in TRL's own GRPOTrainer.

For each config, TRL 1.16's GRPOTrainer and `train` of the imported recipe run on one tiny model
saved to a folder; one reward function records the optimizer step at each generation round and a
TRL callback the learning rate of each optimizer step. Rounds, steps per round and the learning
rate at every step must agree.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import textwrap

import pytest
from cli_runner import run_grpo

from grpocli.errors import UserError
from grpocli.recipe.trl_import import convert
from grpocli.recipe.trl_names import TRL_DEFAULTS, TRL_FIELDS, TRL_UNITS

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
    # num_train_epochs (max_steps -1): TRL counts whole generation batches x steps_per_generation x num_iterations
    "epochs1-accum2": {"gradient_accumulation_steps": 2, "max_steps": -1, "num_train_epochs": 1, "rows": 8},
    "epochs2-accum2-mu2": {"gradient_accumulation_steps": 2, "max_steps": -1, "num_train_epochs": 2,
                           "num_iterations": 2, "rows": 4, "lr_scheduler_type": "cosine"},
    "epochs1.5-spg4-mu2-ragged": {"gradient_accumulation_steps": 2, "steps_per_generation": 4, "max_steps": -1,
                                  "num_train_epochs": 1.5, "num_iterations": 2, "rows": 5},
    "max_steps-wins-over-epochs": {"max_steps": 3, "num_train_epochs": 5, "rows": 4, "warmup_steps": 0.5},
    # 2 processes of 1 completion a micro-batch: TRL's count is its 1-process count at 2 a micro-batch (the
    # global batch and the sampler are the same; accelerate shards each batch over the processes)
    "processes2-accum2": {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 2, "max_steps": 4,
                          "processes": 2},
}


@pytest.fixture
def reward_module(tmp_path, monkeypatch):
    (tmp_path / "trl_import_reward.py").write_text(REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    import trl_import_reward

    yield trl_import_reward
    sys.modules.pop("trl_import_reward", None)


#: The optimizer steps each config trains, worked out by hand as TRL counts them.
STEPS = {"accum4-mu2-cosine-warmup": 5, "accum2-spg4-mu2-warmup-ratio": 6, "accum1-spg2-constant-warmup": 4,
         "epochs1-accum2": 4,               # 8 rows / 2 prompts a step
         "epochs2-accum2-mu2": 8,           # 2 epochs x 2 batches of 2 prompts x 2 iterations
         "epochs1.5-spg4-mu2-ragged": 6,    # 5 rows: 1 whole batch of 4 prompts x 2 steps x 2 iterations; x 1.5
         "max_steps-wins-over-epochs": 3, "processes2-accum2": 4}


def _prompts(fields):
    rows = [{"prompt": f"{a}+{b}="} for a in range(8) for b in range(8)]
    return rows[:fields.get("rows", len(rows))]


def _trl_run(fields, model_dir, out, reward):
    """TRL's own trainer: generation rounds (as global steps) and the lr of each optimizer step."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    lrs = []

    class LearningRates(TrainerCallback):
        def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
            lrs.append(optimizer.param_groups[0]["lr"])

    args = {k: v for k, v in fields.items() if k not in ("reward_funcs", "rows", "processes")}
    if fields.get("processes", 1) > 1:  # one process of the same global batch (see CONFIGS)
        args["per_device_train_batch_size"] *= fields["processes"]
    config = GRPOConfig(output_dir=str(out), report_to="none", save_strategy="no", logging_steps=1,
                        use_cpu=True, disable_tqdm=True, **args)
    data = Dataset.from_list(_prompts(fields))
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=reward.count, args=config, train_dataset=data,
                          callbacks=[LearningRates()])
    reward.SEEN.clear()
    trainer.train()
    return list(reward.SEEN), lrs


def _grpo_run(fields, model_dir, tmp_path, reward):
    from grpocli.recipe import load_recipe
    from grpocli.trainer.loop import train

    out = tmp_path / "trl.json"
    config = {k: v for k, v in fields.items() if k not in ("rows", "processes")}
    out.write_text(json.dumps({**config, "model_name_or_path": str(model_dir)}))
    recipe = tmp_path / "imported.toml"
    result = run_grpo("import", "trl", str(out), "-o", str(recipe), "--num-processes", str(fields.get("processes", 1)))
    assert result.returncode == 0, result.stderr
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in _prompts(fields)))
    reward.SEEN.clear()
    run = tmp_path / "grpo-run"
    # grpo's prompts_per_step is over all processes: one process trains the same steps (train.num_processes=1)
    train(load_recipe(str(recipe), [f"data.dataset='{data}'", f"train.output_dir='{run}'", "log.progress=none",
                                    "log.rollouts_every=0", "train.save_steps=0", "train.torch_threads=1",
                                    "train.num_processes=1"]))
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
    assert len(grpo_lrs) == len(trl_lrs) == STEPS[name]
    assert grpo_lrs == pytest.approx(trl_lrs, rel=1e-9, abs=1e-15), printed


def _written(fields, nproc=1):
    recipe, lines = convert(fields, num_processes=nproc)
    return recipe, {line.name: line for line in lines}, lines


def test_batch_arithmetic_in_grpo_units():
    recipe, _, lines = _written({"per_device_train_batch_size": 4, "gradient_accumulation_steps": 4,
                                       "num_generations": 8, "steps_per_generation": 8}, nproc=2)
    assert recipe["train"]["prompts_per_step"] == 4 * 4 * 2 // 8
    assert recipe["train"]["micro_batch_size"] == 4 and recipe["train"]["num_processes"] == 2
    assert recipe["train"]["steps_per_generation"] == 8 // 4  # micro-batches -> optimizer steps
    text = "\n".join(line.render() for line in lines)
    assert "4 x 4 x 2 / 8" in text and "8 / gradient_accumulation_steps 4" in text
    unset, _, _ = _written({"gradient_accumulation_steps": 4, "generation_batch_size": 64})
    assert unset["train"]["steps_per_generation"] == 64 // 8 // 4 and unset["train"]["prompts_per_step"] == 4


def test_trl_defaults_and_conventions_are_written():
    recipe, by_name, _ = _written({"max_steps": 10})
    assert recipe["train"] | {"lr_scheduler": "linear", "seed": 42, "save_steps": 500, "mixed_precision": "bf16",
                              "steps": 10, "prompts_per_step": 1} == recipe["train"]
    assert recipe["model"]["gradient_checkpointing"] is True and recipe["model"]["dtype"] == "auto"
    assert recipe["generation"]["max_completion_length"] == 512
    assert recipe["algorithm"] | {"drop_zero_spread_groups": False, "kl_importance_correction": True,
                                  "token_normalizer": "generation_batch", "truncated_rows": "count"} \
        == recipe["algorithm"]
    assert by_name["lr_scheduler_type"].kind == "default" and by_name["max_steps"].kind == "mapped"
    _, lines, _ = _written({"fp16": True, "warmup_steps": 0.1, "max_steps": 25, "report_to": "wandb",
                            "num_train_epochs": 2, "no_such_field": 1})
    assert lines["num_train_epochs"].kind == "ignored" and lines["no_such_field"].kind == "ignored"
    assert "ceil(25 x 0.1)" in lines["warmup_steps"].text and "train.warmup_steps = 3" in lines["warmup_steps"].text
    assert "'fp16'" in lines["fp16"].text and "['wandb']" in lines["report_to"].text


@pytest.mark.parametrize(("fields", "says"), [
    ({"gradient_accumulation_steps": 4, "steps_per_generation": 2}, "a multiple of 4"),
    ({"per_device_train_batch_size": 3, "num_generations": 2}, "multiple of 2"),
    ({"steps_per_generation": 1, "generation_batch_size": 16}, "both set"),
])
def test_what_grpo_cannot_express_is_refused(fields, says):
    with pytest.raises(UserError, match=says):
        convert(fields)


def test_trl_defaults_are_grpoconfigs():
    trl = pytest.importorskip("trl", reason="TRL is not installed (pip install 'grpocli[bench]')")
    defaults = {f.name: f.default for f in dataclasses.fields(trl.GRPOConfig)}
    assert {k: defaults[k] for k in TRL_DEFAULTS} == TRL_DEFAULTS


#: TRL defaults that mean what grpo's default means, though the values are written differently.
SAME_MEANING = {"report_to", "fp16", "vllm_mode", "vllm_server_host", "vllm_server_port",
                "multi_objective_aggregation"}


def test_each_differing_default_and_unit_is_stated_in_the_note_and_the_docs():
    trl = pytest.importorskip("trl", reason="TRL is not installed (pip install 'grpocli[bench]')")
    from grpocli.recipe.schema import Recipe

    grpo = Recipe()
    stated = {"bf16", "model_init_kwargs", *TRL_UNITS}  # None defaults that mean a value, and units
    for f in dataclasses.fields(trl.GRPOConfig):
        key = TRL_FIELDS.get(f.name, (None, ""))[0]
        if not key or "[]" in key or f.default in (None, dataclasses.MISSING) or f.name in SAME_MEANING:
            continue
        value = grpo
        for part in key.split("."):
            value = getattr(value, part)
        if value != f.default:
            stated.add(f.name)
            assert "TRL's default" in TRL_FIELDS[f.name][1], (f.name, f.default, value)
    assert all("unit:" in TRL_FIELDS[name][1] for name in TRL_UNITS)
    from test_docs import hook  # tests/test_docs.py: loads docs/hooks/reference.py

    page = hook().trl_fields()  # docs/reference/trl-fields.md, as the site builds it
    for name in sorted(stated):
        key, note = TRL_FIELDS[name]
        assert f"| `{name}` | `{key}` | {note} |" in page, name


def test_inspect_fields_trl_says_the_unit_and_default():
    out = run_grpo("inspect", "fields", "--trl", "steps_per_generation", env={"COLUMNS": "400"})
    assert out.returncode == 0, out.stderr
    assert "unit: TRL counts micro-batches, grpo optimizer steps" in " ".join(out.stdout.split())


def test_grpo_import_trl_command(tmp_path):
    config = tmp_path / "grpo.yaml"
    config.write_text("per_device_train_batch_size: 4\ngradient_accumulation_steps: 2\nnum_generations: 4\n"
                      "max_steps: 12\nreward_funcs: [accuracy_reward]\nvllm_tensor_parallel_size: 2\n")
    out = tmp_path / "recipe.toml"
    result = run_grpo("import", "trl", str(config), "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert "train.prompts_per_step = 2" in result.stdout and "unsupported vllm_tensor_parallel_size" in result.stdout
    assert 'name = "trl.rewards:accuracy_reward"' in out.read_text() and "grpo train" in result.stdout
    again = run_grpo("import", "trl", str(config), "-o", str(out))
    assert again.returncode == 2 and "--force" in again.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("per_device_train_batch_size: [4\n")
    broken = run_grpo("import", "trl", str(bad), "-o", str(tmp_path / "x.toml"))
    assert broken.returncode == 2 and "does not parse" in broken.stderr and "Traceback" not in broken.stderr


def test_grpo_import_trl_reads_a_python_file(tmp_path):
    """read_config as the command runs it (the script in a child process)."""
    pytest.importorskip("trl", reason="TRL is not installed (pip install 'grpocli[bench]')")
    from grpocli.recipe.trl_config_file import read_config

    script = tmp_path / "train_grpo.py"
    script.write_text(textwrap.dedent("""
        from trl import GRPOConfig
        from trl import GRPOTrainer
        args = GRPOConfig(output_dir="out", gradient_accumulation_steps=4, per_device_train_batch_size=2,
                          num_generations=2, max_steps=8, lr_scheduler_type="cosine")
        if __name__ == "__main__":
            GRPOTrainer(model="some/model", reward_funcs="some/reward-model", args=args).train()  # a stand-in
    """))
    fields = read_config(script)  # what it built GRPOConfig with, on a machine without bf16 too
    assert fields == {"output_dir": "out", "gradient_accumulation_steps": 4, "per_device_train_batch_size": 2,
                      "num_generations": 2, "max_steps": 8, "lr_scheduler_type": "cosine",
                      "model_name_or_path": "some/model", "reward_funcs": ["some/reward-model"]}
    recipe, _ = convert(fields, num_processes=2)
    assert recipe["train"]["prompts_per_step"] == 2 * 4 * 2 // 2 and recipe["train"]["lr_scheduler"] == "cosine"
    twice = tmp_path / "two.py"
    twice.write_text("from trl import GRPOConfig\na = GRPOConfig(output_dir='a')\nb = GRPOConfig(output_dir='b')\n")
    with pytest.raises(UserError, match="built 2 GRPOConfig"):
        read_config(twice)
    assert "trl" not in sys.modules or sys.modules["trl"].GRPOConfig.__post_init__.__name__ == "__post_init__"
