"""The paths TRL's VLLMClient uses, answered by the same engine.

TRL >= 1.0 (``trl.generation.vllm_client.VLLMClient``) talks to vLLM's own server, which TRL starts
with ``--weight-transfer-config '{"backend": "nccl"}' --logprobs-mode processed_logprobs
--max-logprobs -1``; this server answers the same paths the same way:

    GET  /health, /v1/models, /get_world_size
    GET  /server_info                      the config TRL reads: weight_transfer_config (backend "nccl" with a
                                           GPU, else "gloo"), model_config.logprobs_mode ("processed_logprobs")
    POST /v1/completions                   prompts as text or token ids; n; logprobs (any count); prompt_logprobs
                                           (get_sequence_logprobs); structured_outputs (structured_outputs_regex);
                                           vLLM's return_token_ids / return_tokens_as_token_ids; any vLLM
                                           sampling field (generation_kwargs): completions.py
    POST /v1/chat/completions              the same for conversations (the model's chat template, tools rendered;
                                           a request's own template only with --trust-request-chat-template:
                                           chat.py)
    POST /reset_prefix_cache          key  (app.py)
    POST /init_weight_transfer_engine, /start_weight_update, /update_weights, /finish_weight_update,
         /shutdown_weight_transfer_engine  key  TRL's weight sync: transfer.py

Older TRL (0.x, ``trl vllm-serve``) posted to /generate/ with ``prompts`` and read ``prompt_ids`` /
``completion_ids`` / ``logprobs``; that path is answered too. TRL's client sends no API key: for
TRL's trainer, start ``grpo vllm-serve`` without --api-key (it binds 127.0.0.1 unless told otherwise).
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from pydantic import ConfigDict, Field, TypeAdapter, field_validator

from grpocli.server.chat import check_templates, check_text_length, render_off_engine
from grpocli.server.completions import (
    ChatRequest,
    CompletionRequest,
    choices,
    envelope,
    greedy_repeats,
    prompt_list,
    prompt_logprobs,
    vllm_params,
)
from grpocli.server.host import EngineHost
from grpocli.wire.generation import TOP_K_MAX, Checked, Seed


class LegacyGenerate(Checked):
    """TRL 0.x's /generate/ body; of its generation_kwargs only ``seed`` is used (checked here)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    prompts: list[str] | list[list[int]] = Field(min_length=1)
    n: int = Field(1, ge=1, le=1024)
    repetition_penalty: float = Field(1.0, gt=0.0)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1, le=TOP_K_MAX)
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    max_tokens: int = Field(16, ge=1)
    generation_kwargs: dict[str, Any] = Field(default_factory=dict)

    @field_validator("generation_kwargs")
    @classmethod
    def _seed_in_range(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        if kwargs.get("seed") is not None:
            try:
                TypeAdapter(Seed).validate_python(kwargs["seed"])
            except ValueError as exc:
                raise ValueError(f"generation_kwargs.seed: {exc.errors()[0]['msg']}") from None
        return kwargs


def add_trl_routes(app: Any, host: EngineHost, key: Any, *, request_timeout: float,
                   trust_templates: bool = False) -> None:
    """TRL's paths on ``app``; ``trust_templates``: run chat templates that requests bring (see chat.py)."""
    from grpocli.server.transfer import add_transfer_routes

    transfer = add_transfer_routes(app, host, key)

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": host.engine.model, "object": "model", "owned_by": "grpo",
                                            "max_model_len": host.engine.max_model_len}]}

    @app.get("/get_world_size")
    def world_size() -> dict[str, int]:
        return {"world_size": host.engine.world_size}

    @app.get("/server_info")
    def server_info(config_format: str = "json") -> dict[str, Any]:
        from grpocli.generation.weights import dtype_name

        engine = host.engine
        config = _vllm_model_config(engine)
        return {"vllm_config": {
            "model_config": {"model": engine.model, "max_model_len": engine.max_model_len,
                             "dtype": dtype_name(engine.dtype),
                             "logprobs_mode": str(getattr(config, "logprobs_mode", "processed_logprobs")),
                             "max_logprobs": getattr(config, "max_logprobs", None)},
            "parallel_config": {"world_size": engine.world_size},
            "weight_transfer_config": {"backend": transfer.backend},
        }}

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request) -> dict[str, Any]:
        params = vllm_params(req, req.logprobs)
        prompts = prompt_list(req.prompt)
        check_text_length([p for p in prompts if isinstance(p, str)], host.prompt_chars(), where="prompt")
        inputs = [p if isinstance(p, str) else {"prompt_token_ids": list(p)}
                  for p in prompts for _ in range(greedy_repeats(req))]
        outs, _ = await host.answer(request, _generate, inputs, params, timeout=request_timeout)
        return envelope("text_completion", req, outs, choices(outs, req, chat=False))

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest, request: Request) -> dict[str, Any]:
        check_templates(req, trusted=trust_templates)
        params = vllm_params(req, (req.top_logprobs or 0) if req.logprobs else None)
        llm = host.engine.llm
        if req.tools or (req.chat_template_kwargs or {}).get("enable_thinking"):
            getattr(llm, "_adjust_params_for_parsing", lambda _: None)([params])  # as LLM.chat does
        prompts = await render_off_engine(llm, req, text_limit=host.prompt_chars())
        inputs = prompts * greedy_repeats(req)
        outs, _ = await host.answer(request, _generate, inputs, params, timeout=request_timeout,
                                    tokenization_kwargs={"add_special_tokens": False})  # the template has them
        body = envelope("chat.completion", req, outs, choices(outs, req, chat=True))
        body["prompt_token_ids"] = list(outs[0].prompt_token_ids) if outs else []
        if req.prompt_logprobs is not None and outs:
            body["prompt_logprobs"] = prompt_logprobs(outs[0])
        return body

    @app.post("/generate/")
    async def legacy_generate(req: LegacyGenerate, request: Request) -> dict[str, Any]:
        from grpocli.generation.base import Sampling

        if isinstance(req.prompts[0], str):
            check_text_length(req.prompts, host.prompt_chars(), where="prompts")
        sampling = Sampling(max_tokens=req.max_tokens, temperature=req.temperature, top_p=req.top_p,
                            top_k=max(req.top_k, 0), min_p=req.min_p, repetition_penalty=req.repetition_penalty)
        out, _ = await host.answer(request, _engine_generate, req.prompts, req.n, sampling,
                                   seed=req.generation_kwargs.get("seed"), timeout=request_timeout)
        return {"prompt_ids": out.prompt_ids, "completion_ids": out.completion_ids, "logprobs": out.logprobs}


def _generate(engine: Any, inputs: list, params: Any, **kwargs: Any) -> list[Any]:
    """vLLM's RequestOutputs of ``inputs`` (on the engine thread)."""
    return engine.llm.generate(inputs, params, use_tqdm=False, **kwargs)


def _engine_generate(engine: Any, prompts: list, n: int, sampling: Any, *, seed: Any) -> Any:
    """The engine's Generated, with log-probs (on the engine thread)."""
    return engine.generate(prompts, n, sampling, logprobs=True, seed=seed)


def _vllm_model_config(engine: Any) -> Any:
    try:
        return engine.llm.llm_engine.model_config
    except AttributeError:
        return None


__all__ = ["add_trl_routes"]
