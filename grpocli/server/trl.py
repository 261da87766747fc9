"""The paths and fields TRL's VLLMClient uses, answered by the same engine (generation only).

TRL >= 1.0 (``trl.generation.vllm_client.VLLMClient``) talks to vLLM's OpenAI-compatible server:
GET /health, GET /v1/models, POST /v1/completions and /v1/chat/completions (with vLLM's
``return_token_ids`` / ``return_tokens_as_token_ids`` extensions), GET /get_world_size,
POST /reset_prefix_cache and GET /server_info. Older TRL (0.x, ``trl vllm-serve``) posted to
/generate/ with ``prompts`` and read ``prompt_ids`` / ``completion_ids`` / ``logprobs``; that path
is answered too. TRL's weight updates go through vLLM's NCCL weight-transfer engine, which this
server does not run: /server_info reports ``weight_transfer_config: null``, so TRL's
``init_communicator`` stops with its own message; grpo's trainer uses /weights/* instead.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from grpocli.server.host import EngineHost, ServerError


class _Sampled(BaseModel):
    model_config = ConfigDict(extra="ignore")  # OpenAI clients send many optional fields

    model: str | None = None
    n: int = Field(1, ge=1, le=1024)
    max_tokens: int | None = Field(16, ge=1)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1)
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(1.0, gt=0.0)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False

    @model_validator(mode="after")
    def _no_streaming(self) -> _Sampled:
        if self.stream:
            raise ValueError("streaming is not supported by grpo vllm-serve; send stream=false")
        return self


class CompletionRequest(_Sampled):
    prompt: str | list[str] | list[int] | list[list[int]] = Field(min_length=1)
    logprobs: int | None = Field(None, ge=0, le=20)


class ChatRequest(_Sampled):
    messages: list[dict[str, Any]] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)


class LegacyGenerate(BaseModel):
    """TRL 0.x's /generate/ body."""

    model_config = ConfigDict(extra="ignore")

    prompts: list[str] | list[list[int]] = Field(min_length=1)
    n: int = Field(1, ge=1, le=1024)
    repetition_penalty: float = Field(1.0, gt=0.0)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1)
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    max_tokens: int = Field(16, ge=1)
    generation_kwargs: dict[str, Any] = Field(default_factory=dict)


def add_trl_routes(app: Any, host: EngineHost, *, request_timeout: float) -> None:
    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": host.engine.model, "object": "model", "owned_by": "grpo",
                                            "max_model_len": host.engine.max_model_len}]}

    @app.get("/get_world_size")
    def world_size() -> dict[str, int]:
        return {"world_size": host.engine.world_size}

    @app.get("/server_info")
    def server_info() -> dict[str, Any]:
        return {"vllm_config": {"weight_transfer_config": None,
                                "model_config": {"model": host.engine.model,
                                                 "max_model_len": host.engine.max_model_len}}}

    @app.post("/v1/completions")
    def completions(req: CompletionRequest) -> dict[str, Any]:
        prompts = _prompt_list(req.prompt)
        outs = host.raw(prompts, req.n, _sampling(req), logprobs=req.logprobs, seed=req.seed, chat=False,
                        timeout=request_timeout)
        pairs = [(o, c) for o in outs for c in o.outputs]   # prompt-major, as TRL reads them
        choices = [_choice(c, o, i, req, chat=False) for i, (o, c) in enumerate(pairs)]
        return _envelope("text_completion", req, choices)

    @app.post("/v1/chat/completions")
    def chat(req: ChatRequest) -> dict[str, Any]:
        outs = host.raw([req.messages], req.n, _sampling(req),
                        logprobs=(req.top_logprobs or 0) if req.logprobs else None, seed=req.seed, chat=True,
                        timeout=request_timeout)
        pairs = [(o, c) for o in outs for c in o.outputs]
        choices = [_choice(c, o, i, req, chat=True) for i, (o, c) in enumerate(pairs)]
        body = _envelope("chat.completion", req, choices)
        body["prompt_token_ids"] = list(outs[0].prompt_token_ids) if outs else []
        return body

    @app.post("/generate/")
    def legacy_generate(req: LegacyGenerate) -> dict[str, Any]:
        sampling = _sampling(req)
        out = host.generate(req.prompts, req.n, sampling, seed=req.generation_kwargs.get("seed"), logprobs=True,
                            timeout=request_timeout)
        return {"prompt_ids": out.prompt_ids, "completion_ids": out.completion_ids, "logprobs": out.logprobs}

    @app.get("/health/")
    def legacy_health() -> dict[str, str]:
        return {"status": "ok"}


def _prompt_list(prompt: Any) -> list:
    if isinstance(prompt, str):
        return [prompt]
    if prompt and isinstance(prompt[0], int):
        return [prompt]
    if any(isinstance(p, list) and not p for p in prompt):
        raise ServerError(400, "an empty prompt")
    return list(prompt)


def _sampling(req: Any) -> Any:
    from grpocli.generation.base import Sampling

    stop = getattr(req, "stop", None)
    return Sampling(max_tokens=req.max_tokens or 16, temperature=req.temperature, top_p=req.top_p,
                    top_k=max(req.top_k, 0), min_p=req.min_p, repetition_penalty=req.repetition_penalty,
                    stop=tuple([stop] if isinstance(stop, str) else (stop or ())))


def _choice(c: Any, o: Any, index: int, req: Any, *, chat: bool) -> dict[str, Any]:
    as_ids = req.return_tokens_as_token_ids
    out: dict[str, Any] = {"index": index, "finish_reason": c.finish_reason, "logprobs": None}
    if chat:
        out["message"] = {"role": "assistant", "content": c.text}
    else:
        out["text"] = c.text
    if req.return_token_ids:
        out["token_ids"] = list(c.token_ids)
        if not chat:
            out["prompt_token_ids"] = list(o.prompt_token_ids)
    if c.logprobs is not None:
        out["logprobs"] = _logprobs(c, as_ids, chat=chat)
    return out


def _logprobs(c: Any, as_ids: bool, *, chat: bool) -> dict[str, Any]:
    def name(token_id: int, entry: Any) -> str:
        return f"token_id:{token_id}" if as_ids else (entry.decoded_token or "")

    tokens, values, tops = [], [], []
    for token_id, position in zip(c.token_ids, c.logprobs, strict=False):
        entry = position.get(token_id)
        tokens.append(name(token_id, entry) if entry else f"token_id:{token_id}")
        values.append(float(entry.logprob) if entry else float("nan"))
        tops.append({name(t, e): float(e.logprob) for t, e in position.items() if t != token_id or len(position) > 1})
    if chat:
        return {"content": [{"token": t, "logprob": v, "bytes": None,
                             "top_logprobs": [{"token": k, "logprob": x} for k, x in top.items()]}
                            for t, v, top in zip(tokens, values, tops)]}
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops}


def _envelope(kind: str, req: Any, choices: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()),
            "model": req.model, "choices": choices}


__all__ = ["add_trl_routes"]
