"""The protocol of `grpo ref-serve`: its version, paths and API-key variable, the request bodies as
pydantic models (the server's routes take them: a malformed body is a 422 naming the field) and the
answers the trainer reads (grpocli.reference.client checks each against its model).

Protocol version 1. Given an API key (``--api-key`` or GRPO_REF_API_KEY), every path requires it.

    GET  /health           {"status": "ok"}, or 503 {"status": "unhealthy", "detail": why}
    GET  /info             ReferenceInfo: kind "reference", protocol, model, dtype, vocab_size,
                           weights_version, damaged, max_batch_tokens, ...
    POST /logprobs         LogprobRequest -> LogprobAnswer: per group, per completion, the log-prob of
                           each token; weights_version
    POST /weights/begin    BeginMix -> MixBegun (update_id): ref = alpha * sent + (1 - alpha) * ref
    POST /weights/bucket   ?update_id=...; body: a bucket of the policy's tensors (safetensors), mixed in
    POST /weights/end      UpdateId -> weights_version, tensors, seconds
    POST /weights/abort    UpdateId
    GET  /weights/bucket   ?index=k -> bucket k of the current weights (safetensors); headers X-Bucket-Count
                           and X-Weights-Version (the buckets of one download are of one version)
    POST /close            the server stops

Errors are JSON ``{"detail": reason}``: 400/422 a bad request (naming the field), 401 no key (from
the headers, before the body is read), 409 an update out of order or damaged weights (no log-probs
or download from half-mixed weights, even for a request that waited behind the update that left
them so), 413 a body over the bound, 504 a request past its timeout, 503 a stuck or dead worker.
The trainer builds its LogprobRequest with ``model_construct`` (the server checks every body).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

PROTOCOL_VERSION = 1
KIND = "reference"  # /info's "kind": what tells a ref-serve from another grpo server
KEY_ENV = "GRPO_REF_API_KEY"
HEALTH_PATH, INFO_PATH, LOGPROBS_PATH, CLOSE_PATH = "/health", "/info", "/logprobs", "/close"
BEGIN_PATH, BUCKET_PATH, END_PATH, ABORT_PATH = "/weights/begin", "/weights/bucket", "/weights/end", "/weights/abort"
BUCKET_COUNT_HEADER, VERSION_HEADER = "X-Bucket-Count", "X-Weights-Version"
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


# -- answers -------------------------------------------------------------------------------------
class ReferenceInfo(BaseModel):
    """GET /info: what the trainer reads of it (the server says more: extra fields are kept)."""

    model_config = ConfigDict(extra="allow")

    kind: Literal["reference"]
    protocol: int
    dtype: str
    weights_version: int
    damaged: str | None = None  # why the weights are partly mixed (an update ended midway), if they are


class LogprobAnswer(BaseModel):
    """POST /logprobs: per group, per completion, each token's reference log-prob."""

    logprobs: list[list[list[float]]]
    weights_version: int


class MixBegun(BaseModel):
    """POST /weights/begin: the update's id (each later call of the update names it)."""

    update_id: str


__all__ = ["ABORT_PATH", "BEGIN_PATH", "BUCKET_COUNT_HEADER", "BUCKET_PATH", "CLOSE_PATH", "END_PATH", "HEALTH_PATH",
           "INFO_PATH", "KEY_ENV", "KIND", "LOGPROBS_PATH", "PROTOCOL_VERSION", "VERSION_HEADER", "BeginMix",
           "LogprobAnswer", "LogprobRequest", "MixBegun", "ReferenceInfo", "SequenceGroup", "UpdateId"]
