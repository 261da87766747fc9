"""The HTTP routes of `grpo ref-serve` (FastAPI + uvicorn) and run_server, which the CLI calls.

It binds 127.0.0.1 unless told otherwise. Given an API key (``--api-key`` or GRPO_REF_API_KEY),
every route requires it, as ``Authorization: Bearer KEY`` or ``X-API-Key: KEY`` (401 without).

    GET  /health           {"status": "ok"}, or 503 {"status": "unhealthy", "detail": why}
    GET  /info             protocol, model, dtype, vocab_size, weights_version, damaged, max_batch_tokens, ...
    POST /logprobs         {"groups": [{"prompt_ids": [...], "completion_ids": [[...], ...]}], "temperature": t}
                           -> {"logprobs": [per group [per completion [log p of each token]]], "weights_version"}
    POST /weights/begin    {"alpha": a, "timeout": s} -> {"update_id"}: ref = a * sent + (1 - a) * ref
    POST /weights/bucket   ?update_id=...; body: a bucket of the policy's tensors (safetensors), mixed in
    POST /weights/end      {"update_id"} -> weights_version, tensors, seconds
    POST /weights/abort    {"update_id"}
    GET  /weights/bucket   ?index=k -> bucket k of the current weights (safetensors); header X-Bucket-Count
    POST /close            the server stops

Errors are JSON ``{"detail": reason}``: 400/422 a bad request (naming the field), 401 no key, 409 an
update out of order or damaged weights, 504 a request past its timeout, 503 a stuck or dead worker.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from grpocli.reference.host import DEFAULT_MAX_BATCH_TOKENS, ReferenceHost
from grpocli.server.app import add_error_handlers, check_port, key_check
from grpocli.server.worker import ServerError

PROTOCOL_VERSION = 1
REQUEST_TIMEOUT = 600.0
LOOPBACK = ("127.0.0.1", "localhost", "::1")
TokenIds = list[int]


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SequenceGroup(Body):
    prompt_ids: TokenIds = Field(..., min_length=1, description="The prompt's token ids.")
    completion_ids: list[TokenIds] = Field(..., description="The completions of the prompt's group.")


class LogprobRequest(Body):
    groups: list[SequenceGroup]
    temperature: float = Field(1.0, gt=0.0, le=100.0, description="The sampling temperature (logits / t).")


class BeginMix(Body):
    alpha: float = Field(..., ge=0.0, le=1.0, description="ref = alpha * sent + (1 - alpha) * ref.")
    timeout: float = Field(300.0, gt=0.0, le=86400.0, description="Longest wait between two calls of the update.")


class UpdateId(Body):
    update_id: str


def build_app(host: ReferenceHost, *, model: str = "", api_key: str | None = None,
              request_timeout: float = REQUEST_TIMEOUT) -> Any:
    """The FastAPI app around ``host``; ``app.state.server`` may hold the uvicorn server (for /close)."""
    app = FastAPI(title="grpo ref-serve", version=str(PROTOCOL_VERSION),
                  dependencies=[Depends(key_check(api_key, env="GRPO_REF_API_KEY"))])
    app.state.server = None

    add_error_handlers(app)

    @app.get("/health")
    def health() -> Any:
        problem = host.health()
        if problem is None:
            return {"status": "ok"}
        return JSONResponse(status_code=503, content={"status": "unhealthy", "detail": problem})

    @app.get("/info")
    def info() -> dict[str, Any]:
        return {"protocol": PROTOCOL_VERSION, "model": model, **host.info()}

    @app.post("/logprobs")
    def logprobs(req: LogprobRequest) -> dict[str, Any]:
        groups = [(g.prompt_ids, g.completion_ids) for g in req.groups]
        return {"logprobs": host.logprobs(groups, req.temperature, request_timeout),
                "weights_version": host.version}

    @app.post("/close")
    def close() -> dict[str, Any]:
        if app.state.server is not None:
            app.state.server.should_exit = True
        return {"closing": True}

    _add_weight_routes(app, host, request_timeout)
    return app


def _add_weight_routes(app: Any, host: ReferenceHost, request_timeout: float) -> None:
    @app.post("/weights/begin")
    def begin(req: BeginMix) -> dict[str, Any]:
        return {"update_id": host.begin(req.alpha, req.timeout)}

    @app.post("/weights/bucket")
    async def bucket(update_id: str, request: Request) -> dict[str, Any]:
        from starlette.concurrency import run_in_threadpool

        from grpocli.generation.weights import unpack_bucket

        try:
            named = unpack_bucket(await request.body())
        except ValueError as exc:
            raise ServerError(400, str(exc)) from None
        return {"received": await run_in_threadpool(host.mix, update_id, named, request_timeout)}

    @app.post("/weights/end")
    def end(req: UpdateId) -> dict[str, Any]:
        return host.end(req.update_id, request_timeout)

    @app.post("/weights/abort")
    def abort(req: UpdateId) -> dict[str, Any]:
        return host.abort(req.update_id, request_timeout)

    @app.get("/weights/bucket")
    def download(index: int = 0) -> Response:
        data, count = host.download(index, request_timeout)
        return Response(content=data, media_type="application/octet-stream", headers={"X-Bucket-Count": str(count)})


def load_model(model: str, dtype: str) -> Any:
    """The reference model of ``--model`` (a directory or hub id) in ``dtype``, frozen, on the GPU if any."""
    import torch
    from transformers import AutoModelForCausalLM

    from grpocli.errors import UserError
    from grpocli.models.source import resolve

    source = resolve(model, key="--model")
    try:
        loaded = AutoModelForCausalLM.from_pretrained(source.path, dtype=dtype,
                                                      local_files_only=source.local_files_only)
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot load a causal language model from {source.path}: {exc}", where="--model",
                        valid="a model directory (save_pretrained) or hub id",
                        hint="grpo ref-serve --model ./runs/NAME/checkpoints/step-0 (the policy's starting weights)") from None
    loaded.eval().requires_grad_(False)
    return loaded.to("cuda") if torch.cuda.is_available() else loaded


def run_server(model: str, host: str = "127.0.0.1", port: int = 8001, api_key: str | None = None, *,
               dtype: str = "auto", max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
               request_timeout: float = REQUEST_TIMEOUT) -> None:
    """Load ``model`` and serve its log-probs until POST /close or a signal."""
    import uvicorn

    check_port(host, port, command="grpo ref-serve")
    if host not in LOOPBACK and api_key is None:
        print(f"grpo ref-serve: listening on {host} without --api-key: anyone who can reach this port "
              "can replace the reference weights", flush=True)
    t0 = time.perf_counter()
    reference = ReferenceHost(load_model(model, dtype), max_batch_tokens=max_batch_tokens,
                              request_timeout=request_timeout)
    app = build_app(reference, model=model, api_key=api_key, request_timeout=request_timeout)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                           timeout_graceful_shutdown=5))
    app.state.server = server
    info = reference.info()
    print(f"grpo ref-serve: {model} ({info['dtype']}, {info['device']}) loaded in {time.perf_counter() - t0:.1f} s; "
          f"serving http://{host}:{port} (protocol {PROTOCOL_VERSION}, {max_batch_tokens} tokens per pass)",
          flush=True)
    server.run()


__all__ = ["build_app", "load_model", "run_server"]
