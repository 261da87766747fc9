"""Stopping `grpo vllm-serve` in bounded time, whatever the engine is doing.

POST /close and a signal both end in uvicorn's shutdown: requests still in flight get ``GRACE`` s,
then their tasks are cancelled (which calls their engine jobs off: grpocli.server.inflight), and
run_server closes the engine host. Two things could still hold the process: a request thread that
does not return (uvicorn waits for it) and an engine call that does not end (a stuck engine cannot
be shut down beside it). A watchdog started with the shutdown ends the process ``WATCHDOG`` s
later in any case, saying why.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

import uvicorn

#: Seconds requests in flight get to finish once the server stops, and the engine to leave its call.
GRACE = 5.0
#: Seconds after the stop began when the process ends whatever still runs (vLLM's own teardown
#: takes a few seconds; this leaves it room).
WATCHDOG = 4 * GRACE


class StoppingServer(uvicorn.Server):
    """uvicorn's server whose shutdown cannot hang (``engine_host``: named in the watchdog's message)."""

    def __init__(self, config: uvicorn.Config, engine_host: Any) -> None:
        super().__init__(config)
        self.engine_host = engine_host

    async def shutdown(self, sockets: Any = None) -> None:
        threading.Thread(target=self._watchdog, name="grpo-stop-watchdog", daemon=True).start()
        await super().shutdown(sockets)

    def _watchdog(self) -> None:
        time.sleep(WATCHDOG)
        stuck = self.engine_host.health()
        exit_now(f"still stopping {WATCHDOG:g} s after the stop began" + (f" ({stuck})" if stuck else ""))


def exit_now(why: str) -> None:
    """End the process at once, saying why (the stop was asked for: exit status 0)."""
    print(f"grpo vllm-serve: stopping without waiting: {why}", flush=True)
    sys.stderr.flush()
    os._exit(0)


__all__ = ["GRACE", "WATCHDOG", "StoppingServer", "exit_now"]
