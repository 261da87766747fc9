"""What each training process is doing, so that a collective that waits too long can say.

Every process notes its phase (`Parallel.doing`: "step 3, rewards"); under grpo's launcher, which
gives the processes a shared folder (`STATUS_DIR`), each writes it there as `rank-R.status`. When
torch.distributed gives up on a collective after train.collective_timeout, the process that
waited stops with a UserError naming the step, its own phase and every other process's, so the
one that was slow or stuck is named (a reward that never returns, a long generation, a full disk
under a checkpoint), instead of the run hanging or dying with a gloo/NCCL traceback.
"""

from __future__ import annotations

import json
import os
import time

from grpocli.errors import UserError

#: A folder the processes of one run share (grpo's launcher sets it): each says there what it does.
STATUS_DIR = "GRPOCLI_STATUS"


def write(rank: int, step: int, what: str, since: float) -> None:
    """This process's phase, where the others can read it (nothing outside grpo's launcher)."""
    folder = os.environ.get(STATUS_DIR)
    if not folder:
        return
    path = os.path.join(folder, f"rank-{rank}.status")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump({"rank": rank, "step": step, "doing": what, "since": since}, f)
    os.replace(path + ".tmp", path)  # readers see a whole line or the last one


def timed_out(exc: BaseException) -> bool:
    """Whether `exc` is torch.distributed giving up on a collective (gloo's or NCCL's timeout)."""
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and _from_distributed(exc) and ("timed out" in text or "timeout" in text)


def stalled(rank: int, activity: tuple[int, str, float] | None, timeout: float) -> UserError:
    """The UserError of a collective that waited more than `timeout` s, naming every process's phase."""
    step, what, _ = activity or (0, "starting", time.time())
    others = "; ".join(last_said(rank)) or "the other processes did not say (not started by `grpo train`)"
    return UserError(
        f"the training processes stopped waiting for each other at step {step}: a collective waited more than "
        f"{timeout:g} s (process {rank} was at: {what}); {others}",
        where="train.collective_timeout", valid="processes that reach each collective within the timeout",
        hint="the process doing something else than waiting was slow or stuck there (a reward that never "
        "returns, a long generation, a full disk under a checkpoint); if it was only slow, raise "
        "train.collective_timeout (seconds)",
    )


def _from_distributed(exc: BaseException) -> bool:
    """Whether `exc` was raised inside torch.distributed (a collective or the process group)."""
    tb = exc.__traceback__
    while tb is not None:
        if "torch/distributed" in tb.tb_frame.f_code.co_filename.replace(os.sep, "/"):
            return True
        tb = tb.tb_next
    return type(exc).__name__ == "DistBackendError"


def last_said(rank: int) -> list[str]:
    """What the processes other than `rank` last said they were doing (`Parallel.doing`), oldest
    first (`rank` -1: all of them)."""
    folder = os.environ.get(STATUS_DIR)
    if not folder or not os.path.isdir(folder):
        return []
    found = []
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".status"):
            continue
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                found.append(json.load(f))
        except (OSError, ValueError):
            continue
    now = time.time()
    return [f"process {d['rank']}: step {d['step']}, {d['doing']} (for {now - d['since']:.0f} s)"
            for d in sorted(found, key=lambda d: d.get("since", 0.0)) if d.get("rank") != rank]
