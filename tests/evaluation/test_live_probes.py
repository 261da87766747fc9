"""eval.reward_probes_every: the `grpo check-rewards` probes of a step's first prompts, beside the
live completions, scored by real rewards (a test reward paying for characters, the built-in
math.accuracy and format.answer_tag); warned once per reward and kind; a real 2-step run."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_runs import FAST, TINY_MODEL

from grpocli.evaluation.live_probes import LIVE_FORMAT, LIVE_LENGTH, LiveProbes, probe_step
from grpocli.models import load_tokenizer
from grpocli.recipe import load_recipe
from grpocli.registry import load_plugins
from grpocli.rewards import RewardFn, resolve
from grpocli.trainer.rollouts import Rollouts, Scored

G = 2
SUMS = [(2, 3), (4, 4), (7, 1)]


def chars(prompts, completions, **kwargs):
    """Pays for characters: the longer, the better."""
    return [float(len(c)) for c in completions]


def boom(prompts, completions, **kwargs):
    if any(c == "" for c in completions):
        raise ValueError("cannot score an empty completion")
    return [1.0] * len(completions)


@pytest.fixture(scope="module")
def setup():
    recipe = load_recipe("quickstart", [*TINY_MODEL, 'rewards=[{name="math.accuracy"}, {name="format.answer_tag"}]',
                                        "data.chat_template=never"]).recipe
    builtin = {rf.name: rf for rf in resolve(recipe.rewards, load_plugins().rewards)}
    return recipe, load_tokenizer(recipe.model), builtin


def scored(completions: list[str], fns: list[RewardFn], tokenizer) -> Scored:
    """The step's Scored as the trainer makes it: arithmetic rows, G completions each, scored by ``fns``."""
    rows = [{"prompt": f"What is {a} + {b}?", "prompt_text": f"What is {a} + {b}?", "answer": str(a + b)}
            for a, b in SUMS]
    ids = [tokenizer(c, add_special_tokens=False)["input_ids"] for c in completions]
    rollouts = Rollouts(rows=rows, prompt_ids=[[1, 2]] * len(rows), completion_ids=ids, completions=completions,
                        truncated=torch.zeros(len(completions), dtype=torch.bool), group_size=G)
    cols = rollouts.columns(("prompt", "prompt_text"))
    per_reward = {rf.name: [float(v) if v is not None else None for v in
                            rf.fn(rollouts.prompts("prompt"), completions, **rf.args, **cols)] for rf in fns}
    return Scored(rollouts, torch.zeros(len(completions)), per_reward)


def test_a_reward_paying_for_length_is_flagged_and_math_accuracy_is_not(setup):
    recipe, tokenizer, builtin = setup
    fns = [RewardFn("chars", chars), builtin["math.accuracy"], RewardFn("boom", boom)]
    live = ["Let me think about this for a good long while, then answer. " + str(a + b)
            for a, b in SUMS for _ in range(G)]  # long live completions, right answers
    step = scored(live, fns[:2], tokenizer)
    fmt, reports, found = probe_step(step, fns, recipe.model_copy(), tokenizer, rows=2, step=7)
    assert fmt.plain
    kinds = {(f.reward, f.kind) for f in found}
    assert kinds == {("chars", "length alone"), ("chars", LIVE_LENGTH)}, found  # not math.accuracy, not boom
    by_name = {r.name: r for r in reports}
    assert by_name["chars"].values["sampled"] == step.per_reward["chars"][:2 * G]  # the step's scores, 2 rows
    assert by_name["math.accuracy"].mean("gold") == 1.0 and by_name["math.accuracy"].mean("wrong") == 0.0
    assert by_name["boom"].failures and "empty" in by_name["boom"].failures  # set aside, nothing raised
    line = next(f for f in found if f.kind == "length alone").line(7, "grpo check-rewards R")
    assert line.startswith("warning: step 7: reward 'chars' pays for length alone: the right answer scores ")
    assert line.endswith("it pays for length, not the answer (grpo check-rewards R probes it)")


def test_live_completions_collecting_the_format_pay_with_wrong_answers_are_said(setup):
    recipe, tokenizer, builtin = setup
    fns = [builtin["math.accuracy"], builtin["format.answer_tag"]]
    wrong = scored([f"<answer>\n{a + b + 5}\n</answer>" for a, b in SUMS for _ in range(G)], fns, tokenizer)
    fmt, _, found = probe_step(wrong, fns, recipe, tokenizer, rows=3, step=1)
    assert fmt.parts == ("answer",)
    assert {(f.reward, f.kind) for f in found} == {("format.answer_tag", "format alone"),
                                                    ("format.answer_tag", LIVE_FORMAT)}, found
    right = scored([f"<answer>\n{a + b}\n</answer>" for a, b in SUMS for _ in range(G)], fns, tokenizer)
    _, _, found = probe_step(right, fns, recipe, tokenizer, rows=3, step=1, fmt=fmt)
    assert {(f.reward, f.kind) for f in found} == {("format.answer_tag", "format alone")}  # the answers are right


def test_each_reward_and_kind_is_warned_once_and_each_probed_step_counts_its_flags(setup):
    recipe, tokenizer, builtin = setup
    fns = [RewardFn("chars", chars), builtin["math.accuracy"]]
    lines = []
    probes = LiveProbes(2, 2, recipe, fns, tokenizer, "grpo check-rewards R", lines.append)
    step = scored(["x" * 40 for _ in range(len(SUMS) * G)], fns, tokenizer)
    assert probes.after(1, step) == {} and not lines  # not due
    counts = {"probes/chars/flags": 2.0, "probes/math.accuracy/flags": 0.0}  # length alone, live pays for length
    assert probes.after(2, step) == counts and probes.after(4, step) == counts
    assert len(lines) == 2 and all(line.startswith("warning: step 2: reward 'chars' ") for line in lines), lines
    assert any(" pays for length alone: " in line for line in lines) and any(
        " pays the live completions for length: they score 40, nearer the right answer padded ('long' probe, "
        in line for line in lines)


def test_probes_that_break_say_so_once_and_stop_without_stopping_the_run(setup):
    recipe, tokenizer, builtin = setup
    lines = []
    probes = LiveProbes(1, 2, recipe, [RewardFn("chars", chars)], None, "grpo check-rewards R", lines.append)
    step = scored(["abc"] * (len(SUMS) * G), [RewardFn("chars", chars)], tokenizer)
    assert probes.after(1, step) == {} and probes.after(2, step) == {}  # no tokenizer: broken
    assert lines == ["warning: step 1: the reward probes (eval.reward_probes_every) failed: TypeError: 'NoneType' "
                     "object is not callable; they are off for the rest of the run"] and probes.every == 0


@pytest.mark.slow
def test_a_real_run_warns_once_of_a_reward_paying_for_length(tmp_path, capsys):
    from grpocli.trainer.loop import train

    out = tmp_path / "run"
    train(load_recipe("quickstart", [*FAST, f"train.output_dir={out}", "eval.reward_probes_every=1"]))  # length
    err = capsys.readouterr().err
    assert err.count("warning: step 1: reward 'length' pays for length alone: ") == 1, err
    assert err.count("reward 'length' pays for length alone") == 1, err  # not again at step 2
    assert f"(grpo check-rewards {out / 'config.resolved.toml'} probes it)" in err, err
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]  # one line per step, as without the probes
