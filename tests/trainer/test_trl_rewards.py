"""A TRL user's rewards, unchanged: TRL's own `trl.rewards`, and a reward with TRL 1.16's full
signature (completion_ids, trainer_state, log_extra, log_metric), trained for real on a tiny
model with conversational data, where TRL hands completions over as message lists."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
from tiny_runs import TINY_MODEL

from grpocli.errors import UserError
from grpocli.recipe import load_recipe
from grpocli.trainer.loop import train

FAST = [
    *TINY_MODEL, "generation.max_completion_length=8",
    "generation.num_generations=4", "train.prompts_per_step=2", "train.steps=2",
    "train.micro_batch_size=8", "log.progress=none", "log.rollouts_every=1",
]

FULL_SIGNATURE = '''
SEEN = []


def full(prompts, completions, completion_ids, trainer_state, log_extra, log_metric, **kwargs):
    """TRL 1.16's whole reward signature."""
    SEEN.append({"step": trainer_state.global_step, "max_steps": trainer_state.max_steps,
                 "epoch": trainer_state.epoch, "completion": completions[0], "solution": kwargs["solution"][0],
                 "ids": len(completion_ids) == len(completions)})
    log_extra("length_seen", [len(c[0]["content"]) for c in completions])
    log_metric("custom/mean_ids", sum(len(i) for i in completion_ids) / len(completion_ids))
    return [float(len(c[0]["content"])) for c in completions]


def needs_a_column_nobody_has(prompts, completions, reference_answer):
    return [0.0] * len(completions)
'''


@pytest.fixture
def conversational(tmp_path, monkeypatch):
    """A conversational dataset file (TRL's format: prompt messages, a solution column) and a
    module with rewards on the import path."""
    rows = [{"prompt": [{"role": "user", "content": f"{a}+{b}="}], "solution": str(a + b)}
            for a in range(4) for b in range(4)]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "trl_user_rewards.py").write_text(textwrap.dedent(FULL_SIGNATURE))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    yield data
    sys.modules.pop("trl_user_rewards", None)


def test_trl_rewards_and_the_full_signature_train(conversational, tmp_path):
    pytest.importorskip("trl.rewards", reason="TRL is not installed (pip install 'grpocli[bench]')")
    out = tmp_path / "run"
    train(load_recipe("quickstart", [
        *FAST, f"data.dataset='{conversational}'", "data.args={}", f"train.output_dir='{out}'",
        'rewards=[{name="trl.rewards:accuracy_reward"}, {name="trl.rewards:think_format_reward"}, '
        '{name="trl_user_rewards:full", weight=0.01}]',
    ]))
    import trl_user_rewards

    seen = trl_user_rewards.SEEN
    assert [s["step"] for s in seen] == [0, 1] and {s["max_steps"] for s in seen} == {2}
    assert seen[1]["epoch"] > seen[0]["epoch"] >= 0.0 and all(s["ids"] for s in seen)
    # completions are message lists, as TRL makes them for a conversational prompt
    assert seen[0]["completion"][0]["role"] == "assistant" and isinstance(seen[0]["completion"][0]["content"], str)
    assert seen[0]["solution"] in {str(n) for n in range(7)}
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    for name in ("accuracy_reward", "think_format_reward", "full"):  # TRL's keys: the functions' names
        assert f"rewards/{name}/mean" in metrics[-1], sorted(metrics[-1])
    assert metrics[-1]["custom/mean_ids"] > 0  # log_metric lands in metrics.jsonl
    rollout = json.loads((out / "rollouts" / "step-2.jsonl").read_text().splitlines()[0])
    assert rollout["extra"]["length_seen"] == len(rollout["completion"])  # log_extra lands in rollouts


def test_a_reward_that_can_never_be_called_is_refused_before_any_model(conversational):
    from grpocli.trainer.preflight import preflight

    recipe = load_recipe("quickstart", [*FAST, f"data.dataset='{conversational}'", "data.args={}",
                                        'rewards=[{name="trl_user_rewards:needs_a_column_nobody_has"}]']).recipe
    with pytest.raises(UserError) as err:
        preflight(recipe)
    assert "reference_answer" in err.value.what and "trl_user_rewards:needs_a_column_nobody_has" in err.value.what
    assert "solution" in err.value.valid  # the dataset's columns are named
