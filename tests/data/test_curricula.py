"""Curricula: the next prompts depend on how the last ones scored; state stays JSON."""

from __future__ import annotations

import json

import pytest

from grpocli.data.curricula import replay_unsolved, row_key, skip_solved
from grpocli.errors import UserError


def _rows(*names):
    return [{"prompt": n, "prompt_text": f"<{n}>", "answer": i} for i, n in enumerate(names)]


def _call(fn, metas, rewards, state, next_rows, batch_size=4, **args):
    return fn(
        prompts=[m["prompt"] for m in metas],
        completions=[["c"] * len(r) for r in rewards],
        rewards=rewards,
        metas=metas,
        state=state,
        batch_size=batch_size,
        next_rows=next_rows,
        **args,
    )


def test_registered_through_the_hook(curriculum_registry):
    assert {e.name for e in curriculum_registry} == {"replay_unsolved", "skip_solved"}
    assert curriculum_registry.get("replay_unsolved").plugin == "grpocli.data.curricula"


def test_returned_prompts_change_with_rewards():
    metas = _rows("a", "b", "c", "d")
    fresh = _rows("e", "f", "g", "h")
    solved = _call(replay_unsolved, metas, [[1.0, 1.0]] * 4, {}, iter(fresh))
    assert solved is None  # nothing to replay: the dataset's own order
    state = {}
    rewards = [[0.0, 0.0], [1.0, 1.0], [0.0, 1.0], [0.0, 0.25]]  # means 0, 1, 0.5, 0.125
    batch = _call(replay_unsolved, metas, rewards, state, iter(fresh), replay_fraction=0.5)
    assert [r["prompt"] for r in batch] == ["a", "d", "e", "f"]  # 2 replays + 2 fresh
    assert json.loads(json.dumps(state))["replayed"] == 2


def test_fresh_rows_are_taken_from_the_stream_exactly():
    stream = iter(_rows("e", "f", "g", "h", "i"))
    batch = _call(replay_unsolved, _rows("a"), [[0.0, 0.0]], {}, stream, batch_size=4)
    assert [r["prompt"] for r in batch] == ["a", "e", "f", "g"]  # round(0.25 * 4) = 1 replay
    assert next(stream)["prompt"] == "h"  # the trainer's position moved by 3, not 4


def test_a_prompt_leaves_the_pool_when_solved_or_after_its_last_replay():
    a = _rows("a")
    state: dict = {}
    fresh = lambda: iter(_rows("x", "y", "z", "w"))  # noqa: E731
    args = {"batch_size": 2, "replay_fraction": 0.5, "max_replays": 2}
    assert _call(replay_unsolved, a, [[0.0]], state, fresh(), **args)[0]["prompt"] == "a"
    assert _call(replay_unsolved, a, [[0.0]], state, fresh(), **args)[0]["prompt"] == "a"
    # the second replay failed as well: out of the pool, the dataset goes on
    assert _call(replay_unsolved, a, [[0.0]], state, fresh(), **args) is None
    assert state["pool"] == []
    state = {}
    _call(replay_unsolved, a, [[0.0]], state, fresh(), **args)
    assert _call(replay_unsolved, a, [[1.0]], state, fresh(), **args) is None  # solved on replay


def test_none_rewards_are_left_out_of_the_mean():
    state: dict = {}
    rewards = [[None, None], [None, 1.0], [None, 0.0]]
    metas, fresh = _rows("a", "b", "c"), iter(_rows("x", "y"))
    batch = _call(replay_unsolved, metas, rewards, state, fresh, batch_size=3, replay_fraction=1.0)
    assert [r["prompt"] for r in batch] == ["c", "x", "y"]  # only c scored below 0.5


def test_replay_fraction_is_checked():
    with pytest.raises(UserError) as err:
        _call(replay_unsolved, [], [], {}, iter([]), replay_fraction=2)
    assert err.value.where == "train.curriculum_args.replay_fraction"


def test_skip_solved_leaves_solved_prompts_out_of_later_epochs():
    epoch = _rows("a", "b", "c", "d")
    state: dict = {}
    assert _call(skip_solved, epoch, [[0.0, 0.0]] * 4, state, iter(epoch)) is None
    rewards = [[1.0, 1.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]]
    stream = iter(epoch + _rows("e", "f"))
    batch = _call(skip_solved, epoch, rewards, state, stream, batch_size=3)
    assert [r["prompt"] for r in batch] == ["b", "d", "e"]
    assert next(stream)["prompt"] == "f"
    assert state["skipped"] == 2 and len(json.loads(json.dumps(state))["solved"]) == 2
    # everything solved: the batch is still full (topped up with solved rows)
    full = _call(skip_solved, epoch, [[1.0]] * 4, state, iter(epoch), batch_size=2, max_skip_factor=2)
    assert [r["prompt"] for r in full] == ["a", "b"]


def test_row_key_follows_what_the_model_sees():
    assert row_key({"prompt": "a", "prompt_text": "T"}) == row_key({"prompt": "b", "prompt_text": "T"})
    assert row_key({"prompt": [{"role": "user", "content": "a"}]}) != row_key({"prompt": "a"})
