"""The HTTP routes of `grpo ref-serve` (FastAPI + uvicorn) and run_server, which the CLI calls.

It binds 127.0.0.1 unless told otherwise. Given an API key (``--api-key`` or GRPO_REF_API_KEY),
every route requires it, as ``Authorization: Bearer KEY`` or ``X-API-Key: KEY`` (401 without,
from the headers before the body is read: grpocli.serving.access.guard). A body is bounded by
``DEFAULT_MAX_BODY`` (413), except a weight bucket's (one tensor may be larger). The paths, the
request bodies and the answers are declared in grpocli/wire/reference.py.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from grpocli.reference.host import DEFAULT_MAX_BATCH_TOKENS, ReferenceHost
from grpocli.serving.access import LOOPBACK, ServerError, add_error_handlers, check_port, guard, key_check
from grpocli.wire import reference as wire
from grpocli.wire.reference import PROTOCOL_VERSION, BeginMix, LogprobRequest, UpdateId

REQUEST_TIMEOUT = 600.0


def build_app(host: ReferenceHost, *, model: str = "", api_key: str | None = None,
              request_timeout: float = REQUEST_TIMEOUT) -> Any:
    """The FastAPI app around ``host``; ``app.state.server`` may hold the uvicorn server (for /close)."""
    app = FastAPI(title="grpo ref-serve", version=str(PROTOCOL_VERSION),
                  dependencies=[Depends(key_check(api_key, env=wire.KEY_ENV))])
    app.state.server = None

    add_error_handlers(app)

    @app.get(wire.HEALTH_PATH)
    def health() -> Any:
        problem = host.health()
        if problem is None:
            return {"status": "ok"}
        return JSONResponse(status_code=503, content={"status": "unhealthy", "detail": problem})

    @app.get(wire.INFO_PATH)
    def info() -> dict[str, Any]:
        return {"protocol": PROTOCOL_VERSION, "model": model, **host.info()}

    @app.post(wire.LOGPROBS_PATH)
    def logprobs(req: LogprobRequest) -> dict[str, Any]:
        groups = [(g.prompt_ids, g.completion_ids) for g in req.groups]
        logprobs, version = host.logprobs(groups, req.temperature, request_timeout)
        return {"logprobs": logprobs, "weights_version": version}

    @app.post(wire.CLOSE_PATH)
    def close() -> dict[str, Any]:
        if app.state.server is not None:
            app.state.server.should_exit = True
        return {"closing": True}

    _add_weight_routes(app, host, request_timeout)
    guard(app, api_key, env=wire.KEY_ENV, limits={wire.BUCKET_PATH: None})
    return app


def _add_weight_routes(app: Any, host: ReferenceHost, request_timeout: float) -> None:
    @app.post(wire.BEGIN_PATH)
    def begin(req: BeginMix) -> dict[str, Any]:
        return {"update_id": host.begin(req.alpha, req.timeout)}

    @app.post(wire.BUCKET_PATH)
    async def bucket(update_id: str, request: Request) -> dict[str, Any]:
        from starlette.concurrency import run_in_threadpool

        from grpocli.generation.weights import unpack_bucket

        try:
            named = unpack_bucket(await request.body())
        except ValueError as exc:
            raise ServerError(400, str(exc)) from None
        return {"received": await run_in_threadpool(host.mix, update_id, named, request_timeout)}

    @app.post(wire.END_PATH)
    def end(req: UpdateId) -> dict[str, Any]:
        return host.end(req.update_id, request_timeout)

    @app.post(wire.ABORT_PATH)
    def abort(req: UpdateId) -> dict[str, Any]:
        return host.abort(req.update_id, request_timeout)

    @app.get(wire.BUCKET_PATH)
    def download(index: int = 0) -> Response:
        data, count, version = host.download(index, request_timeout)
        return Response(content=data, media_type="application/octet-stream",
                        headers={wire.BUCKET_COUNT_HEADER: str(count), wire.VERSION_HEADER: str(version)})


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
