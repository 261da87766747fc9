"""TRL's keys that grpo now takes: num_train_epochs, warmup_ratio, chat_template_kwargs, live completions
(log.completions_to_print), and `grpo inspect RUN` showing what rewards logged (log_metric, log_extra).

One real `grpo train` subprocess on the tiny model (3 steps) serves the training and inspect tests."""

from __future__ import annotations

import json
import textwrap

import pytest

REWARD = '''
def judged(prompts, completions, log_metric, log_extra, **kwargs):
    log_metric("judge/mean_chars", sum(len(c) for c in completions) / len(completions))
    log_extra("judge_note", [f"chars={len(c)}" for c in completions])
    return [-abs(len(c) - 4) for c in completions]
'''

RECIPE = '''
[model]
name_or_path = "tiny"
[data]
chat_template = "always"
dataset = "arithmetic"
args = {{ num_samples = 24 }}
[[rewards]]
name = "{reward}:judged"
[generation]
num_generations = 2
max_completion_length = 8
[train]
prompts_per_step = 4
num_train_epochs = 0.5
warmup_ratio = 0.5
lr_scheduler = "linear"
torch_threads = 1
output_dir = "{out}"
[log]
completions_to_print = 2
progress = "plain"
rollouts_every = 1
'''


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from cli_runner import run_grpo

    root = tmp_path_factory.mktemp("trl-keys")
    (root / "judge.py").write_text(REWARD)
    recipe = root / "trl_keys.toml"
    recipe.write_text(RECIPE.format(reward=root / "judge.py", out=root / "run"))
    out = run_grpo("train", str(recipe), env={"OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    return root / "run", out


@pytest.mark.slow
def test_epochs_and_warmup_ratio_resolve_to_steps_that_are_recorded(trained):
    import tomllib

    run, out = trained
    train = tomllib.loads((run / "config.resolved.toml").read_text())["train"]
    assert (train["steps"], train["warmup_steps"]) == (3, 2)  # ceil(0.5 x 24 / 4); ceil(0.5 x 3)
    assert "train.steps = 3" in out.stderr and "train.warmup_steps = 2" in out.stderr
    rates = [json.loads(line)["learning_rate"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rates == pytest.approx([0.0, 0.5e-6, 1e-6])  # the linear warm-up over 2 of the 3 steps


@pytest.mark.slow
def test_live_completions_print_each_step_with_rewards(trained):
    _, out = trained
    for step in (1, 2, 3):
        assert f"step {step}: 2 completions" in out.stderr
    block = out.stderr.split("step 1: 2 completions", 1)[1]
    assert "judged" in block and "advantage" in block and "completion: " in block


@pytest.mark.slow
def test_inspect_shows_log_metric_keys_and_log_extra_columns(trained):
    from rich.console import Console

    from grpocli.inspection.overview import show_run

    run, _ = trained
    console = Console(record=True, width=200)
    show_run(str(run), write_png=False, console=console)
    text = console.export_text()
    assert "rewards' log_metric" in text and "judge/mean_chars" in text
    assert "log_extra columns: judge_note" in text
    show_run(str(run), rollouts_step=1, console=console)
    text = console.export_text()
    assert "log_extra" in text and "judge_note: chars=" in text


def test_train_steps_set_in_the_recipe_wins_over_epochs_as_trl_max_steps():
    from grpocli.recipe import load_recipe
    from grpocli.recipe.duration import resolve_duration

    given = load_recipe(None, ["train.num_train_epochs=2", "train.steps=5", "train.warmup_ratio=0.1"])
    resolved, notes = resolve_duration(given, rows=100)
    assert resolved.recipe.train.steps == 5 and resolved.recipe.train.warmup_steps == 1
    assert "wins over train.num_train_epochs" in notes[0]
    derived, _ = resolve_duration(load_recipe(None, ["train.num_train_epochs=2", "train.prompts_per_step=8"]), rows=100)
    assert derived.recipe.train.steps == 24  # as TRL: 2 epochs x 12 whole batches of 8 (TRL drops the 4 left)
    kept, _ = resolve_duration(load_recipe(None, ["train.warmup_ratio=0.5", "train.warmup_steps=3"]), rows=100)
    assert kept.recipe.train.warmup_steps == 3  # as TRL: warmup_steps above 0 wins
    longer = load_recipe(None, ["train.warmup_ratio=0.1", "train.steps=200"])
    assert resolve_duration(longer, 100)[0].recipe.train.warmup_steps == 20
    resumed, _ = resolve_duration(longer, 100, saved={"warmup_ratio": 0.1, "warmup_steps": 10, "steps": 100})
    assert resumed.recipe.train.warmup_steps == 10  # a resume that extends the run keeps its warm-up


def test_live_completions_on_a_terminal_are_a_rich_table():
    from rich.console import Console

    from grpocli.trainer.completion_log import rich_table

    rows = [{"prompt": "<|im_start|>user 2+2=", "completion": "4", "rewards": {"math.accuracy": 1.0, "fmt": None},
             "reward": 1.0, "advantage": 0.5}]
    console = Console(record=True, width=120)
    console.print(rich_table(7, rows))
    text = console.export_text()
    assert "step 7: 1 completions" in text and "math.accuracy" in text and "None" in text and "0.5" in text


def test_chat_template_kwargs_reach_the_template():
    from grpocli.data.template import render_row
    from grpocli.models import build_char_tokenizer
    from grpocli.recipe import load_recipe

    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = textwrap.dedent("""\
        {%- for m in messages %}{{ m['content'] }}{% endfor -%}
        {%- if enable_thinking is defined and not enable_thinking %}<no-think>{% else %}<think>{% endif -%}""")
    row = {"prompt": [{"role": "user", "content": "2+2="}]}
    off = load_recipe(None, ["data.chat_template_kwargs={enable_thinking=false}"]).recipe.data
    assert render_row(row, off, tokenizer)["prompt_text"] == "2+2=<no-think>"
    assert render_row(row, load_recipe(None, []).recipe.data, tokenizer)["prompt_text"] == "2+2=<think>"
