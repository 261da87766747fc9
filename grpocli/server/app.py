"""The HTTP routes of `grpo vllm-serve` (FastAPI + uvicorn) and run_server, which the CLI calls.

The server binds 127.0.0.1 unless told otherwise. With an API key, every route that changes
state (weights, cache, group, close) requires it, as ``Authorization: Bearer KEY`` or
``X-API-Key: KEY``, checked from the headers before the body is read (an unknown path needs it
too: grpocli.serving.access.guard); every body but a weight bucket's is bounded by
``DEFAULT_MAX_BODY`` (413). A malformed request gets a 4xx whose ``detail`` says what was wrong (a 422
lists each field's location and reason, never echoing the input back: it may hold a NaN, which
JSON cannot carry); no request can stop the server except POST /close, which stops it even when
the engine is stuck (``run_server``). /health answers 503 with the reason when the engine is stuck
or dead (grpocli.server.host), so a supervisor can restart it, and says "updating" or
"weights_incomplete" (200) while the weights are not one complete version. A request whose client
disconnects, or that runs past ``request_timeout``, is aborted inside the engine
(grpocli.server.inflight). The paths and fields are declared in grpocli/wire/generation.py;
TRL's VLLMClient paths are added by trl.py. As with TRL's own server (``--max-logprobs -1``), a
request may ask for any number of log-probs.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse

from grpocli.server.chat import check_text_length
from grpocli.server.host import EngineHost
from grpocli.server.trl import add_trl_routes
from grpocli.serving.access import LOOPBACK, ServerError, add_error_handlers, check_port, guard, key_check
from grpocli.wire import generation as wire
from grpocli.wire.generation import (
    PROTOCOL_VERSION,
    BeginUpdate,
    BroadcastBucket,
    EndUpdate,
    GenerateRequest,
    OpenGroup,
)

#: Longest a generate request may keep the engine (s); the client's own timeout is usually shorter.
REQUEST_TIMEOUT = 1800.0


def build_app(host: EngineHost, *, api_key: str | None = None, request_timeout: float = REQUEST_TIMEOUT,
              trust_request_chat_template: bool = False) -> Any:
    """The FastAPI app around ``host``; ``app.state.server`` may hold the uvicorn server (for /close).
    ``trust_request_chat_template``: run chat templates that requests bring (grpocli.server.chat)."""
    app = FastAPI(title="grpo vllm-serve", version=str(PROTOCOL_VERSION))
    app.state.host, app.state.server = host, None
    key = Depends(key_check(api_key, env=wire.KEY_ENV))
    add_error_handlers(app)
    _add_engine_routes(app, host, key, request_timeout)
    _add_weight_routes(app, host, key)
    add_trl_routes(app, host, key, request_timeout=request_timeout, trust_templates=trust_request_chat_template)
    guard(app, api_key, env=wire.KEY_ENV, limits={wire.BUCKET_PATH: None})
    return app


def _add_engine_routes(app: Any, host: EngineHost, key: Any, request_timeout: float) -> None:
    @app.get(wire.HEALTH_PATH)
    @app.get("/health/")  # TRL 0.x's path
    def health() -> Any:
        return health_answer(host)

    @app.get(wire.INFO_PATH)
    def info() -> dict[str, Any]:
        return {"protocol": PROTOCOL_VERSION, **host.info()}

    @app.post(wire.GENERATE_PATH)
    async def generate(req: GenerateRequest, request: Request) -> dict[str, Any]:
        if req.prompts is not None:
            check_text_length(req.prompts, host.prompt_chars(), where="prompts")
        out, version = await host.answer(request, _engine_generate, req.prompts or req.prompt_ids, req.n,
                                         _sampling(req), seed=req.seed, logprobs=req.logprobs,
                                         timeout=request_timeout)
        return {"prompt_ids": out.prompt_ids, "completion_ids": out.completion_ids, "logprobs": out.logprobs,
                "truncated": out.truncated, "weights_version": version}

    @app.post(wire.RESET_PATH, dependencies=[key])
    def reset_prefix_cache() -> dict[str, Any]:
        host.reset_prefix_cache(timeout=request_timeout)
        return {"reset": True}

    @app.post(wire.CLOSE_PATH, dependencies=[key])
    def close() -> dict[str, Any]:
        if app.state.server is not None:
            app.state.server.should_exit = True
        return {"closing": True}


def _add_weight_routes(app: Any, host: EngineHost, key: Any) -> None:
    @app.post(wire.BEGIN_PATH, dependencies=[key])
    def begin(req: BeginUpdate) -> dict[str, Any]:
        from grpocli.generation.weights import TensorSpec

        spec = [TensorSpec(t.name, tuple(t.shape), t.dtype) for t in req.spec] if req.spec is not None else None
        u = host.begin(spec, req.aliases, req.timeout, req.transport)
        return {"update_id": u.id, "checked": spec is not None}

    @app.post(wire.BUCKET_PATH, dependencies=[key])
    async def bucket(update_id: str, request: Request) -> dict[str, Any]:
        from starlette.concurrency import run_in_threadpool

        from grpocli.generation.weights import unpack_bucket

        data = await request.body()
        u = host.current(update_id)
        try:
            named = unpack_bucket(data)
        except ValueError as exc:
            raise ServerError(400, str(exc)) from None
        await run_in_threadpool(u.put, named)
        return {"received": len(named)}

    @app.post(wire.BROADCAST_PATH, dependencies=[key])
    def broadcast(req: BroadcastBucket) -> dict[str, Any]:
        from grpocli.generation.weights import TensorSpec

        specs = [TensorSpec(t.name, tuple(t.shape), t.dtype) for t in req.tensors]
        try:
            return {"received": host.receive_broadcast(req.update_id, specs)}
        except ValueError as exc:  # an unknown dtype in the spec
            raise ServerError(400, str(exc)) from None

    @app.post(wire.END_PATH, dependencies=[key])
    def end(req: EndUpdate) -> dict[str, Any]:
        return host.end(req.update_id)

    @app.post(wire.ABORT_PATH, dependencies=[key])
    def abort(req: EndUpdate) -> dict[str, Any]:
        return host.end(req.update_id, abort=True)

    @app.post(wire.GROUP_PATH, dependencies=[key])
    def group(req: OpenGroup) -> dict[str, Any]:
        return {"port": host.open_group(req.backend, req.timeout), "backend": req.backend, "rank": 0,
                "world_size": 2}


def health_answer(host: EngineHost) -> Any:
    """{"status": "ok"} when the server can generate; a 503 {"status": "unhealthy", "detail": why} for
    a stuck or dead engine (restart it); 200 {"status": "updating" | "weights_incomplete", "detail": why,
    "weights_version": N} while a weight update is in flight or after one failed: the server is alive
    and refuses generation (409) until a complete update ends, which a restart would not bring."""
    problem = host.health()
    if problem is not None:
        return JSONResponse(status_code=503, content={"status": "unhealthy", "detail": problem})
    state = host.weights_state()
    if state is not None:
        return {"status": state[0], "detail": state[1], "weights_version": host.version}
    return {"status": "ok"}


def _engine_generate(engine: Any, prompts: list, n: int, sampling: Any, *, seed: Any, logprobs: bool) -> Any:
    """The engine's Generated (on the engine thread)."""
    return engine.generate(prompts, n, sampling, logprobs=logprobs, seed=seed)


def _sampling(req: Any) -> Any:
    from grpocli.generation.base import Sampling

    return Sampling(max_tokens=req.max_tokens, temperature=req.temperature, top_p=req.top_p,
                    top_k=max(req.top_k, 0), min_p=req.min_p, repetition_penalty=req.repetition_penalty,
                    stop=tuple(req.stop))


def run_server(model: str, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
               max_model_len: int | None = None, dtype: str = "auto", *, gpu_memory_utilization: float = 0.9,
               enforce_eager: bool | None = None, kv_cache_gb: float = 1.0, seed: int = 0,
               request_timeout: float = REQUEST_TIMEOUT, max_num_batched_tokens: int | None = None,
               trust_request_chat_template: bool = False, log_level: str = "warning",
               engine_kwargs: dict[str, Any] | None = None) -> None:
    """Start a vLLM engine on ``model`` and serve it until POST /close or a signal. ``enforce_eager``
    None: on for a CPU, off on CUDA (CUDA graphs); the engine runs on this process's current GPU.

    ``engine_kwargs``: more of vllm.LLM's arguments (trl vllm-serve's flags, grpocli.server.flags).

    Stopping is bounded (grpocli.server.stopping): requests still in flight get ``GRACE`` s, then
    are called off; an engine still inside a call after that (stuck) is left, and the process exits."""
    import uvicorn

    from grpocli.generation.vllm_colocate import VllmEngine, prepare_vllm_environment
    from grpocli.models.source import resolve
    from grpocli.server.stopping import GRACE, StoppingServer, exit_now

    source = resolve(model, key="--model")
    check_port(host, port, command="grpo vllm-serve")  # before the engine's half minute of start-up
    prepare_vllm_environment(kv_cache_gb=kv_cache_gb, in_process=True)
    if host not in LOOPBACK and api_key is None:
        print(f"grpo vllm-serve: listening on {host} without --api-key: anyone who can reach this port "
              "can replace the weights", flush=True)
    t0 = time.perf_counter()
    engine = VllmEngine(source.path, dtype=dtype, max_model_len=max_model_len, enforce_eager=enforce_eager,
                        gpu_memory_utilization=gpu_memory_utilization, seed=seed, max_logprobs=-1,
                        max_num_batched_tokens=max_num_batched_tokens, where="--model",
                        length_where="--max-model-len", engine_kwargs=engine_kwargs)
    engine_host = EngineHost(engine, bind_host=host)
    app = build_app(engine_host, api_key=api_key, request_timeout=request_timeout,
                    trust_request_chat_template=trust_request_chat_template)
    server = StoppingServer(uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                           timeout_graceful_shutdown=GRACE), engine_host)
    app.state.server = server
    print(f"grpo vllm-serve: engine on {source.path} started in {time.perf_counter() - t0:.1f} s; serving "
          f"http://{host}:{port} (protocol {PROTOCOL_VERSION}, max_model_len {engine.max_model_len})", flush=True)
    try:
        server.run()
    finally:
        if not engine_host.close(wait=GRACE):
            exit_now(f"the engine is still inside a call ({engine_host.health() or 'busy'})")


__all__ = ["build_app", "health_answer", "run_server"]
