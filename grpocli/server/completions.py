"""The OpenAI-style bodies of /v1/completions and /v1/chat/completions, as vLLM's own server takes them
and TRL's VLLMClient sends them: the request models, the vLLM ``SamplingParams`` they become, and the
choices (with log-probs and prompt log-probs) that vLLM's outputs become.

Beyond the OpenAI fields, a body may carry any of vLLM's sampling fields (``structured_outputs``,
``prompt_logprobs``, ``min_tokens``, ``stop_token_ids``, ``ignore_eos``, ``frequency_penalty``,
``logit_bias``, ...: TRL passes its ``generation_kwargs`` this way). OpenAI's bookkeeping fields
(``user``, ``stream_options``, ...) are ignored; any other field is refused with a 400 naming it,
so nothing a client asks for is silently dropped.

Log-probs follow vLLM's server: ``-inf`` (a token the sampling settings exclude) is sent as -9999.0
(JSON has no infinity), and prompt log-probs are computed from the raw logits, whatever the
temperature (vLLM: "prompt tokens do not go through sampling processors").
"""

from __future__ import annotations

import functools
import inspect
import math
import time
import uuid
from typing import Any

from pydantic import ConfigDict, Field, field_validator, model_validator

from grpocli.server.host import is_bad_input
from grpocli.serving.access import ServerError
from grpocli.wire.generation import TOP_K_MAX, Checked, Seed

#: OpenAI fields that change nothing here; accepted and ignored.
IGNORED = frozenset({"user", "stream_options", "service_tier", "store", "metadata", "parallel_tool_calls",
                     "request_id", "priority", "suffix", "best_of", "echo"})
#: vLLM sampling fields a JSON body cannot carry (internal, or objects this server does not build).
NOT_FROM_JSON = frozenset({"output_kind", "skip_clone", "repetition_detection", "trace_decode_token_ids",
                           "prompt_logprob_token_ids", "structured_outputs"})
#: What JSON cannot hold; vLLM's server sends the same stand-in.
LOWEST_LOGPROB = -9999.0


class _Sampled(Checked):
    # vLLM's sampling fields pass through (their numbers checked by Checked; the rest in vllm_params)
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    model: str | None = None
    n: int = Field(1, ge=1, le=1024)
    max_tokens: int | None = Field(16, ge=1)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1, le=TOP_K_MAX)
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(1.0, gt=0.0)
    stop: str | list[str] | None = None
    seed: Seed | None = None
    stream: bool = False
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False
    structured_outputs: dict[str, Any] | None = Field(
        None, description="vLLM's StructuredOutputsParams: {'regex': ...} | {'json': ...} | {'choice': [...]} | ...")
    prompt_logprobs: int | None = Field(None, ge=-1, description="top prompt log-probs per position (-1: all)")

    @model_validator(mode="after")
    def _no_streaming(self) -> _Sampled:
        if self.stream:
            raise ValueError("streaming is not supported by grpo vllm-serve; send stream=false")
        if (self.model_extra or {}).get("echo"):
            raise ValueError("echo=true is not supported by grpo vllm-serve; the prompt is in prompt_token_ids")
        return self


class CompletionRequest(_Sampled):
    prompt: str | list[str] | list[int] | list[list[int]] = Field(min_length=1)
    logprobs: int | None = Field(None, ge=-1, description="top log-probs per completion token (-1: all)")


class ChatRequest(_Sampled):
    messages: list[dict[str, Any]] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=-1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False

    @field_validator("messages")
    @classmethod
    def _messages_are_text(cls, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for i, message in enumerate(messages):
            message_problem(message, f"messages[{i}]")
        return messages

    @model_validator(mode="after")
    def _tools_are_rendered_only(self) -> ChatRequest:
        if self.tools and self.tool_choice not in (None, "none"):
            raise ValueError("tool_choice must be 'none' (as TRL sends it): grpo vllm-serve renders the tools into "
                             "the prompt and returns the text; the caller parses tool calls")
        return self


def message_problem(message: dict[str, Any], where: str) -> None:
    """ValueError (pydantic's 422) naming the field of a chat message that is not one vLLM can render:
    a role that is not text, content that is not text, null or a list of content parts ({"type": ...})."""
    role = message.get("role")
    if not isinstance(role, str):
        raise ValueError(  # noqa: TRY004 - pydantic turns a ValueError into the 422
            f"{where}.role: must be text ('system', 'user', 'assistant', 'tool', ...), not {_kind(role)}")
    content = message.get("content")
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise ValueError(  # noqa: TRY004
            f"{where}.content: must be text, a list of content parts or null, not {_kind(content)}")
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise ValueError(  # noqa: TRY004
                f"{at}: a content part is an object with a 'type' ('text', ...), not {_kind(part)}")
        if part["type"] == "text" and not isinstance(part.get("text"), str):
            raise ValueError(f"{at}.text: a text part's 'text' must be text, not {_kind(part.get('text'))}")


def _kind(value: Any) -> str:
    return "missing" if value is None else f"a JSON {_JSON_NAMES.get(type(value), type(value).__name__)}"


_JSON_NAMES = {int: "number", float: "number", bool: "boolean", dict: "object", list: "array", str: "string"}


# -- request -> vLLM ----------------------------------------------------------------------------
def vllm_params(req: _Sampled, logprobs: int | None) -> Any:
    """vLLM SamplingParams of a request (n = 1 for greedy decoding: see ``greedy_repeats``)."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    extra = dict(req.model_extra or {})
    passed = _passthrough_fields()
    unknown = sorted(k for k in extra if k not in passed and k not in IGNORED)
    if unknown:
        raise ServerError(400, f"unknown field(s) {', '.join(map(repr, unknown))}: grpo vllm-serve takes the OpenAI "
                               f"fields and vLLM's sampling fields ({', '.join(sorted(passed))})")
    kwargs = {k: v for k, v in extra.items() if k in passed}
    if req.structured_outputs:
        kwargs["structured_outputs"] = structured_outputs(req.structured_outputs, StructuredOutputsParams)
    stop = req.stop
    max_tokens = getattr(req, "max_completion_tokens", None) or req.max_tokens or 16
    try:
        return SamplingParams.from_optional(
            **{**kwargs, "n": 1 if req.temperature == 0 else req.n, "max_tokens": max_tokens,
               "temperature": req.temperature, "top_p": req.top_p, "top_k": max(req.top_k, 0),
               "min_p": req.min_p, "repetition_penalty": req.repetition_penalty,
               "stop": [stop] if isinstance(stop, str) else stop, "seed": req.seed, "logprobs": logprobs,
               "prompt_logprobs": req.prompt_logprobs})
    except Exception as exc:
        if not is_bad_input(exc):  # vLLM's VLLMValidationError is a VLLMClientError, not a ValueError
            raise
        raise ServerError(400, f"{type(exc).__name__}: {exc}") from None


#: The kinds of StructuredOutputsParams, of which a request gives exactly one.
STRUCTURED_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


def structured_outputs(given: dict[str, Any], params_class: Any) -> Any:
    """vLLM's StructuredOutputsParams of ``given``, or a 400 naming what is wrong with it."""
    kinds = [k for k in STRUCTURED_KINDS if given.get(k) is not None]
    if len(kinds) != 1:
        raise ServerError(400, f"structured_outputs: give exactly one kind of constraint ({', '.join(STRUCTURED_KINDS)}), "
                               f"not {' and '.join(map(repr, kinds)) if kinds else 'none'}")
    try:
        return params_class(**given)
    except Exception as exc:
        if isinstance(exc, TypeError) or is_bad_input(exc):  # an unknown key; vLLM's own checks
            raise ServerError(400, f"structured_outputs: {exc}") from None
        raise


def greedy_repeats(req: _Sampled) -> int:
    """vLLM takes n = 1 only for greedy decoding: the prompt is repeated n times instead."""
    return req.n if req.temperature == 0 else 1


def prompt_list(prompt: Any) -> list:
    if isinstance(prompt, str):
        return [prompt]
    if prompt and isinstance(prompt[0], int):
        return [prompt]
    if any(isinstance(p, list) and not p for p in prompt):
        raise ServerError(400, "an empty prompt")
    return list(prompt)


@functools.cache
def _passthrough_fields() -> frozenset[str]:
    from vllm import SamplingParams

    names = set(inspect.signature(SamplingParams.from_optional).parameters)
    return frozenset(names - NOT_FROM_JSON - set(_Sampled.model_fields) - {"logprobs"})


# -- vLLM -> response ---------------------------------------------------------------------------
def choices(outputs: list[Any], req: Any, *, chat: bool) -> list[dict[str, Any]]:
    """One choice per completion, prompt-major (as TRL reads them)."""
    pairs = [(o, c) for o in outputs for c in o.outputs]
    return [_choice(c, o, i, req, chat=chat) for i, (o, c) in enumerate(pairs)]


def _choice(c: Any, o: Any, index: int, req: Any, *, chat: bool) -> dict[str, Any]:
    as_ids = req.return_tokens_as_token_ids
    out: dict[str, Any] = {"index": index, "finish_reason": c.finish_reason, "stop_reason": c.stop_reason,
                           "logprobs": None}
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
    if not chat and o.prompt_logprobs is not None:
        out["prompt_logprobs"] = prompt_logprobs(o)
    return out


def prompt_logprobs(o: Any) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's prompt log-probs: per prompt position None (the first) or {token id: logprob, rank, decoded_token}."""
    return [None if position is None else
            {str(t): {"logprob": _finite(e.logprob), "rank": e.rank, "decoded_token": e.decoded_token}
             for t, e in position.items()}
            for position in o.prompt_logprobs]


def _logprobs(c: Any, as_ids: bool, *, chat: bool) -> dict[str, Any]:
    def name(token_id: int, entry: Any) -> str:
        return f"token_id:{token_id}" if as_ids or entry is None else (entry.decoded_token or "")

    tokens, values, tops = [], [], []
    for token_id, position in zip(c.token_ids, c.logprobs, strict=False):
        entry = position.get(token_id)
        tokens.append(name(token_id, entry))
        values.append(_finite(entry.logprob) if entry else LOWEST_LOGPROB)
        tops.append({name(t, e): _finite(e.logprob) for t, e in position.items()
                     if t != token_id or len(position) > 1})
    if chat:
        return {"content": [{"token": t, "logprob": v, "bytes": None,
                             "top_logprobs": [{"token": k, "logprob": x} for k, x in top.items()]}
                            for t, v, top in zip(tokens, values, tops)]}
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops}


def _finite(x: float) -> float:
    x = float(x)
    return LOWEST_LOGPROB if math.isnan(x) or x < LOWEST_LOGPROB else x


def envelope(kind: str, req: Any, outputs: list[Any], choice_list: list[dict[str, Any]]) -> dict[str, Any]:
    prompt_tokens = sum(len(o.prompt_token_ids or ()) for o in outputs)
    completion_tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()), "model": req.model,
            "choices": choice_list,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


__all__ = ["ChatRequest", "CompletionRequest", "choices", "envelope", "greedy_repeats", "prompt_list",
           "prompt_logprobs", "vllm_params"]
