"""`RunState`: the run's counters, the part of a checkpoint that is neither weights nor optimizer;
and `is_due`, the one rule for "every N steps" (checkpoints, evaluation, rollouts, reference refresh).

The loop advances the counters; checkpoints save `state_dict()` and resume restores it with
`load_state_dict()`. The data position is the prompt stream's own state
(`grpocli.data.stream.PromptStream.state_dict`), saved beside these in the same state.json.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RunState:
    step: int = 0                                   # optimizer steps taken
    num_tokens: int = 0                             # prompt + completion tokens generated, all processes
    last_saved: int = 0                             # step of the newest checkpoint (0: none yet)
    curriculum_state: dict[str, Any] = field(default_factory=dict)  # the curriculum's own memory
    pending_rows: list[dict[str, Any]] | None = None  # rows the curriculum chose for the next batch

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "num_tokens": self.num_tokens, "curriculum_state": self.curriculum_state,
                "pending_rows": self.pending_rows}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint's state (which was saved at its own step)."""
        self.step = self.last_saved = int(state["step"])
        self.num_tokens = int(state.get("num_tokens", 0))
        self.curriculum_state = dict(state.get("curriculum_state") or {})
        self.pending_rows = state.get("pending_rows")

    def take_pending(self) -> list[dict[str, Any]] | None:
        """The rows the curriculum chose, once (None when it chose none)."""
        rows, self.pending_rows = self.pending_rows, None
        return rows


def is_due(every: int | None, step: int, since: int | None = None) -> bool:
    """True when something done every ``every`` optimizer steps is due at ``step``.

    Without ``since``: ``step`` is a multiple of ``every``. With ``since`` (the step when it was
    last considered, e.g. the start of a generation cycle of several optimizer steps): a multiple
    of ``every`` lies in (since, step], so no multiple is skipped. ``every`` of 0 or None: never.
    """
    if not every or every <= 0:
        return False
    if since is None:
        return step % every == 0
    return step // every > since // every
