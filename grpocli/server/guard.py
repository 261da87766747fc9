"""What `grpo vllm-serve` adds to stock `vllm serve`: one ASGI middleware, loaded by vLLM's own
``--middleware grpocli.server.guard.Guard`` (grpocli/server/command.py adds the flag). Each part exists
because stock vLLM 0.32 lacks it (docs/vllm.md "What grpo vllm-serve adds"):

1. The API key on every route but the read-only ones. vLLM's ``--api-key`` guards only /v1, /v2,
   /inference and /cohere: its RL API (/pause, /update_weights, /init_weight_transfer_engine, ...)
   and /reset_prefix_cache answer anyone who reaches the port. The key is vLLM's own VLLM_API_KEY.
2. A bound on every request body, checked before a byte of it is read (413): vLLM reads and parses
   any body first. GRPO_VLLM_MAX_BODY_MB sets it (`grpo vllm-serve --max-body-mb`).
3. Health that says whether the weights are one complete version: between POST /start_weight_update
   and a successful POST /finish_weight_update (a trainer killed mid-sync never sends it), and after
   an update in which a POST /update_weights failed (vLLM finishes it all the same, with the layers that
   got no tensor as they were), /health answers 503 and generation requests are refused with 503 unless
   the engine is paused (/pause: then vLLM holds them until /resume, as in-flight updates need); the next
   complete update repairs it. Stock /health says only that the engine process lives. The state is this
   API process's: with --api-server-count above 1, each has its own.

Both 1 and 2 are grpocli.serving.access's KeyFirst, the same check `grpo ref-serve` and
`grpo reward-serve` use. Light imports only: vLLM's API process loads this before it serves.
"""

from __future__ import annotations

import json
import os
from typing import Any

from grpocli.serving.access import KeyFirst, answer
from grpocli.wire.vllm_api import INCOMPLETE as INCOMPLETE_START

#: Routes anyone may call: they read, and change nothing.
OPEN_PATHS = frozenset({"/health", "/ping", "/version", "/metrics", "/load", "/is_paused", "/get_world_size",
                        "/weight_info", "/server_info"})
START, UPDATE, FINISH = "/start_weight_update", "/update_weights", "/finish_weight_update"
PAUSE, RESUME = "/pause", "/resume"
GENERATION = ("/v1/completions", "/v1/chat/completions", "/inference/v1/generate", "/generate")
#: The variable the body bound comes by (MiB), and its default.
MAX_BODY_ENV, MAX_BODY_MB = "GRPO_VLLM_MAX_BODY_MB", 256.0
OPEN = (f"{INCOMPLETE_START}: an update started (POST /start_weight_update) and has not finished "
        "(POST /finish_weight_update); the next complete update repairs them")
FAILED = (f"{INCOMPLETE_START}: a POST /update_weights of the last update failed, so some layers hold the "
          "old weights; the next complete update repairs them")


class Guard:
    """``--middleware grpocli.server.guard.Guard``: the key and body bound (KeyFirst), then the weights'
    completeness (``WeightState``); vLLM constructs it with the app alone, so it reads the environment."""

    def __init__(self, app: Any) -> None:
        self.state = WeightState(app)
        key = os.environ.get("VLLM_API_KEY") or None
        mb = float(os.environ.get(MAX_BODY_ENV) or MAX_BODY_MB)
        self.app = KeyFirst(self.state, api_key=key, env="GRPO_VLLM_API_KEY", open_paths=OPEN_PATHS,
                            max_body=int(mb * 2**20), limits={})

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)


class WeightState:
    """Whether an update is open or failed, and whether the engine is paused, from the RL API calls that pass."""

    def __init__(self, app: Any) -> None:
        self.app, self.paused = app, False
        self.incomplete: str | None = None  # why the weights are not one complete version (OPEN, FAILED), or None
        self.failed = False  # a POST /update_weights of the open update failed

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if self.incomplete and path == "/health":
            await send_json(send, 503, {"status": "weights_incomplete", "detail": self.incomplete})
            return
        if self.incomplete and not self.paused and path in GENERATION:
            await answer(send, 503, self.incomplete + "; generation waits for it (or for POST /pause)")
            return
        status = {}

        async def watched(message: Any) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        await self.app(scope, receive, watched)
        ok = status.get("code") == 200
        if path == START and ok:
            self.incomplete, self.failed = OPEN, False
        elif path == UPDATE and not ok and self.incomplete:
            self.failed = True
        elif path == FINISH and ok:
            self.incomplete = FAILED if self.failed else None
        elif path in (PAUSE, RESUME) and ok:
            self.paused = path == PAUSE


async def send_json(send: Any, status: int, content: dict) -> None:
    body = json.dumps(content).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


__all__ = ["Guard", "OPEN_PATHS", "WeightState"]
