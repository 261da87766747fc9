"""`is_due`: the one rule for "every N steps" (checkpoints, evaluation, rollouts, reference refresh)."""

from __future__ import annotations


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
