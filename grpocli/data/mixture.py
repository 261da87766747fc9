"""The order prompts are drawn in from a weighted mixture of sources ([[data.sources]]).

Which source the prompt at each position comes from is drawn in blocks of ``BLOCK`` positions: block
b's sources are ``BLOCK`` systematic draws over the cumulative shares (one uniform offset from
``Random(f"mixture:{seed}:{b}")``, then evenly spaced points), shuffled by the same generator. So a
block holds each source floor or ceil of ``BLOCK x share`` times (a share under 1/BLOCK comes with that
probability), a step's prompts are a random draw from the block, and the whole order is a function of
(seed, weights, position) alone. Within a source the rows come in its own `PromptStream`'s order
(seeded epoch shuffles, a seed per source), at the count of that source's draws before.

As PromptStream's, the whole state is one integer, ``position`` (prompts handed out so far): a resumed
run continues with exactly the prompt that came next, every data-parallel process sees the same global
order, and ``row_at`` gives any earlier position's row again. Each row comes with its source's name in
``SOURCE_COLUMN`` (the rewards never receive it; rollouts record it).
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import random
from collections.abc import Iterator, Sequence
from typing import Any

from grpocli.data.stream import PromptStream
from grpocli.recipe.data_sources import SOURCE_COLUMN

#: Draws per block: a block's counts of each source are within one of BLOCK x its share.
BLOCK = 1024


class MixtureStream(Iterator[dict[str, Any]]):
    """Rows of several sources (``[(name, rows)]``, e.g. RenderedPrompts each) drawn by ``weights``, without end."""

    def __init__(
        self,
        sources: Sequence[tuple[str, Sequence[dict[str, Any]]]],
        weights: Sequence[float],
        *,
        seed: int,
        shuffle: bool = True,
        position: int = 0,
    ) -> None:
        if not sources or len(sources) != len(weights):
            raise ValueError("MixtureStream needs one weight per source, and at least one source")
        if any(not w > 0 for w in weights):
            raise ValueError(f"MixtureStream weights must be > 0, got {list(weights)}")
        self.names = [name for name, _ in sources]
        self.streams = [PromptStream(rows, seed=source_seed(seed, name), shuffle=shuffle) for name, rows in sources]
        total = float(sum(weights))
        self.shares = [float(w) / total for w in weights]
        self._bounds = list(itertools.accumulate(self.shares))[:-1]  # the last source takes the rest up to 1
        self.seed, self.position = seed, position
        self._starts: list[list[int]] = [[0] * len(sources)]  # [b]: each source's draws before block b
        self._block: tuple[int, list[int], list[int]] | None = None  # (b, source of each position, its rank)

    @property
    def rows(self) -> int:
        """Rows of all sources together (an epoch of the mixture, as the run counts epochs)."""
        return sum(len(s.prompts) for s in self.streams)

    def __next__(self) -> dict[str, Any]:
        row = self.row_at(self.position)
        self.position += 1
        return row

    def take(self, n: int) -> list[dict[str, Any]]:
        """The next ``n`` rows."""
        return [next(self) for _ in range(n)]

    def row_at(self, position: int) -> dict[str, Any]:
        """The row handed out at ``position``, with its source's name in SOURCE_COLUMN."""
        b, offset = divmod(position, BLOCK)
        sources, ranks = self._draws(b)
        k = sources[offset]
        row = self.streams[k].row_at(self._start(b)[k] + ranks[offset])
        return {**row, SOURCE_COLUMN: self.names[k]}

    def source_at(self, position: int) -> str:
        """The name of the source the prompt at ``position`` comes from."""
        b, offset = divmod(position, BLOCK)
        return self.names[self._draws(b)[0][offset]]

    def drawn(self, position: int | None = None) -> dict[str, int]:
        """How many of the prompts before ``position`` (default: the current one) each source gave."""
        position = self.position if position is None else position
        b, offset = divmod(position, BLOCK)
        counts = list(self._start(b))
        for k in self._draws(b)[0][:offset]:
            counts[k] += 1
        return dict(zip(self.names, counts, strict=True))

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = int(state["position"])

    def _draws(self, b: int) -> tuple[list[int], list[int]]:
        """Block ``b``'s source index at each of its positions, and each one's rank among its source's draws there."""
        if self._block is None or self._block[0] != b:
            rng, sources = self._systematic(b)
            rng.shuffle(sources)
            seen = [0] * len(self.names)
            ranks = []
            for k in sources:
                ranks.append(seen[k])
                seen[k] += 1
            self._block = (b, sources, ranks)
        return self._block[1], self._block[2]

    def _start(self, b: int) -> list[int]:
        """Each source's draws before block ``b`` (the blocks before counted once, then kept)."""
        while len(self._starts) <= b:
            done = len(self._starts) - 1
            counts = list(self._starts[done])
            for k in self._systematic(done)[1]:  # the counts, whatever the order
                counts[k] += 1
            self._starts.append(counts)
        return self._starts[b]

    def _systematic(self, b: int) -> tuple[random.Random, list[int]]:
        """Block ``b``'s generator and its sources in draw order (before the shuffle): BLOCK evenly spaced
        points from one uniform offset over the cumulative shares."""
        rng = random.Random(f"mixture:{self.seed}:{b}")
        offset = rng.random()
        return rng, [bisect.bisect_right(self._bounds, (offset + j) / BLOCK) for j in range(BLOCK)]


class MixedRows(Sequence):
    """Every source's rows one after another, each with its source's name in SOURCE_COLUMN (what the run
    counts its epochs by: the mixture's epoch is prompts drawn over these rows)."""

    def __init__(self, sources: Sequence[tuple[str, Sequence[dict[str, Any]]]]) -> None:
        self.sources = list(sources)
        self._ends = list(itertools.accumulate(len(rows) for _, rows in self.sources))

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __getitem__(self, index: int) -> dict[str, Any]:  # type: ignore[override]
        if not 0 <= index < len(self):
            raise IndexError(index)
        k = bisect.bisect_right(self._ends, index)
        name, rows = self.sources[k]
        return {**rows[index - (self._ends[k - 1] if k else 0)], SOURCE_COLUMN: name}


def source_seed(seed: int, name: str) -> int:
    """The seed of one source's own row order: the run's seed and the source's name, hashed."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "big")


__all__ = ["BLOCK", "MixedRows", "MixtureStream", "source_seed"]
