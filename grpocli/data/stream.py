"""The order prompts are drawn in: epoch after epoch, each shuffled by (seed, epoch), forever.

The whole state is one integer, ``position`` (rows handed out so far), so resuming from a
checkpoint continues with exactly the row that came next, and every data-parallel process
that builds the stream with the same seed sees the same global order (each takes its slice).
A curriculum gets the stream as ``next_rows``: the rows it takes are the rows consumed.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from typing import Any


class PromptStream(Iterator[dict[str, Any]]):
    """Rows of ``prompts`` (e.g. a RenderedPrompts) in seeded epoch order, without end."""

    def __init__(
        self,
        prompts: Sequence[dict[str, Any]],
        *,
        seed: int,
        shuffle: bool = True,
        position: int = 0,
    ) -> None:
        if len(prompts) == 0:
            raise ValueError("PromptStream needs at least one row")
        self.prompts, self.seed, self.shuffle = prompts, seed, shuffle
        self.position = position
        self._epoch_order: tuple[int, list[int]] | None = None

    @property
    def epoch(self) -> int:
        """The epoch the next row belongs to (0-based)."""
        return self.position // len(self.prompts)

    def __next__(self) -> dict[str, Any]:
        epoch, offset = divmod(self.position, len(self.prompts))
        row = self.prompts[self._order(epoch)[offset]]
        self.position += 1
        return row

    def take(self, n: int) -> list[dict[str, Any]]:
        """The next ``n`` rows."""
        return [next(self) for _ in range(n)]

    def row_at(self, position: int) -> dict[str, Any]:
        """The row handed out at ``position`` (a row given out before, to give it again)."""
        epoch, offset = divmod(position, len(self.prompts))
        return self.prompts[self._order(epoch)[offset]]

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = int(state["position"])

    def _order(self, epoch: int) -> list[int]:
        if self._epoch_order is None or self._epoch_order[0] != epoch:
            order = list(range(len(self.prompts)))
            if self.shuffle:
                random.Random(f"prompts:{self.seed}:{epoch}").shuffle(order)
            self._epoch_order = (epoch, order)
        return self._epoch_order[1]
