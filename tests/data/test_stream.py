"""Prompt order: seeded epochs, exact resume from a position."""

from __future__ import annotations

from grpocli.data.stream import PromptStream

ROWS = [{"prompt": str(i)} for i in range(10)]


def _prompts(rows):
    return [r["prompt"] for r in rows]


def test_each_epoch_is_a_seeded_permutation():
    stream = PromptStream(ROWS, seed=3)
    first, second = _prompts(stream.take(10)), _prompts(stream.take(10))
    assert sorted(first) == sorted(second) == sorted(_prompts(ROWS))
    assert first != second and stream.epoch == 2
    assert _prompts(PromptStream(ROWS, seed=3).take(20)) == first + second
    assert _prompts(PromptStream(ROWS, seed=4).take(10)) != first


def test_resume_continues_with_the_next_row():
    stream = PromptStream(ROWS, seed=0)
    stream.take(13)
    state = stream.state_dict()
    expected = _prompts(stream.take(9))
    resumed = PromptStream(ROWS, seed=0)
    resumed.load_state_dict(state)
    assert _prompts(resumed.take(9)) == expected


def test_unshuffled_order_is_the_dataset_order():
    assert _prompts(PromptStream(ROWS, seed=0, shuffle=False).take(12)) == _prompts(ROWS + ROWS[:2])
