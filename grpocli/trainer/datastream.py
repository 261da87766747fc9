"""The order prompts are drawn in: seeded shuffles per epoch and a position that resumes."""

from __future__ import annotations

import random
from typing import Any


class PromptStream:
    """Yields dataset row indices: epoch e is a permutation seeded by (seed, e)."""

    def __init__(self, size: int, *, seed: int, shuffle: bool, position: int = 0) -> None:
        if size == 0:
            raise ValueError("the dataset is empty")
        self.size = size
        self.seed = seed
        self.shuffle = shuffle
        self.position = position  # prompts consumed so far, all processes together

    def _order(self, epoch: int) -> list[int]:
        order = list(range(self.size))
        if self.shuffle:
            random.Random(f"{self.seed}-{epoch}").shuffle(order)
        return order

    def take(self, n: int) -> list[int]:
        """The next n row indices (wrapping into the next epoch)."""
        out: list[int] = []
        while len(out) < n:
            epoch, offset = divmod(self.position, self.size)
            chunk = self._order(epoch)[offset : offset + (n - len(out))]
            out.extend(chunk)
            self.position += len(chunk)
        return out

    @property
    def epoch(self) -> float:
        return self.position / self.size

    def state(self) -> dict[str, Any]:
        return {"position": self.position}
