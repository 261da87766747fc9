"""The weighted draw of a [[data.sources]] mixture (grpocli.data.mixture): the realised shares follow the
weights, the order is a function of the seed alone, and a stream built at a position continues it exactly."""

from __future__ import annotations

from collections import Counter

import pytest

from grpocli.data.mixture import BLOCK, MixedRows, MixtureStream
from grpocli.recipe.data_sources import SOURCE_COLUMN


def _sources(*sizes: int) -> list[tuple[str, list[dict]]]:
    return [(f"s{k}", [{"i": i, "of": k} for i in range(n)]) for k, n in enumerate(sizes)]


@pytest.mark.parametrize("weights", [[3, 1], [1, 1, 1], [0.7, 0.2, 0.1], [100, 1]])
def test_realised_shares_match_the_weights(weights):
    stream = MixtureStream(_sources(*[37] * len(weights)), weights, seed=5)
    n = 4 * BLOCK
    drawn = Counter(row[SOURCE_COLUMN] for row in stream.take(n))
    total = sum(weights)
    for k, w in enumerate(weights):
        # systematic draws: each block of BLOCK holds floor or ceil of BLOCK x share of each source
        assert abs(drawn[f"s{k}"] - n * w / total) <= 4, (weights, drawn)
    assert stream.drawn() == {name: drawn[name] for name in stream.names}


def test_a_steps_worth_is_near_the_shares_too():
    """Any window of draws is a sample of its block, without replacement: 64 prompts at 3:1 stay near 48:16."""
    stream = MixtureStream(_sources(10, 10), [3, 1], seed=0)
    for _ in range(20):
        drawn = Counter(row[SOURCE_COLUMN] for row in stream.take(64))
        assert 36 <= drawn["s0"] <= 60, drawn


def test_same_seed_same_order_other_seed_another():
    def order(seed: int) -> list[tuple[str, int]]:
        return [(r[SOURCE_COLUMN], r["i"]) for r in MixtureStream(_sources(7, 5, 3), [2, 1, 1], seed=seed).take(3000)]

    assert order(3) == order(3)
    assert order(3) != order(4)


def test_a_stream_built_at_a_position_continues_exactly():
    """What a resume does: the state is one integer (position), saved and loaded as PromptStream's."""
    whole = MixtureStream(_sources(7, 5), [1, 2], seed=1)
    rows = whole.take(2 * BLOCK + 300)
    for cut in (0, 1, 17, BLOCK - 1, BLOCK, BLOCK + 5, 2 * BLOCK + 299):
        resumed = MixtureStream(_sources(7, 5), [1, 2], seed=1)
        resumed.load_state_dict(whole.state_dict() | {"position": cut})
        assert resumed.take(len(rows) - cut) == rows[cut:], cut
    again = MixtureStream(_sources(7, 5), [1, 2], seed=1)
    assert [again.row_at(p) for p in (2 * BLOCK + 7, 3, BLOCK + 1)] == [rows[2 * BLOCK + 7], rows[3], rows[BLOCK + 1]]
    assert whole.state_dict() == {"position": len(rows)}


def test_each_source_goes_through_all_its_rows_each_epoch():
    """Within a source the rows come in its own seeded epoch order: every row once before any comes again."""
    stream = MixtureStream(_sources(5, 11), [1, 1], seed=2)
    by_source: dict[str, list[int]] = {}
    for row in stream.take(400):
        by_source.setdefault(row[SOURCE_COLUMN], []).append(row["i"])
    for name, size in (("s0", 5), ("s1", 11)):
        seen = by_source[name]
        for epoch in range(len(seen) // size):
            assert sorted(seen[epoch * size : (epoch + 1) * size]) == list(range(size)), (name, epoch)
    assert by_source["s0"][:5] != by_source["s1"][:5]  # a seed of its own per source


def test_rows_are_stamped_and_not_changed():
    parts = _sources(2, 3)
    stream = MixtureStream(parts, [1, 1], seed=0)
    row = next(stream)
    assert row[SOURCE_COLUMN] in ("s0", "s1") and SOURCE_COLUMN not in parts[0][1][0]
    mixed = MixedRows(parts)
    assert len(mixed) == 5 and mixed[4] == {"i": 2, "of": 1, SOURCE_COLUMN: "s1"} and mixed[0][SOURCE_COLUMN] == "s0"
    with pytest.raises(IndexError):
        mixed[5]


def test_refuses_what_cannot_be_drawn():
    with pytest.raises(ValueError):
        MixtureStream(_sources(3, 3), [1, 0], seed=0)
    with pytest.raises(ValueError):
        MixtureStream([], [], seed=0)
