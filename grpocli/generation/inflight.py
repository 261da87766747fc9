"""The InflightBackend protocol (generation.pipeline = "inflight"): an engine that keeps generating
while the trainer trains, and takes new weights between two of its steps without draining.

The trainer's pipeline (grpocli.trainer.pipeline) drives it with five calls:

    submit(groups, sampling)     start G completions of each group; returns at once. A group's
                                 completion i samples with seed ``group.seed + i`` (vLLM's own
                                 n-sampling seeds), so a group repeats its tokens for its seed
    finished(timeout)            the groups whose G completions have all ended since the last call,
                                 in the order they ended; waits up to ``timeout`` seconds for one
                                 (None: until one ends), [] when none did
    sync_weights(model, version) pause between engine steps with every request kept, load the
                                 model's weights, label what is sampled from now on ``version``,
                                 resume: requests in flight continue with the new weights
    idle_seconds()               how long the engine has had nothing to generate, in all
    close()                      abort what is in flight and stop

Every completion token carries the policy version whose weights sampled it and the engine's
log-prob of it (`FinishedGroup.versions`, `.logprobs`), so the trainer's importance ratio
(grpocli.trainer.mismatch) is per token against the policy that sampled it, and staleness is the
trainer's version minus the token's.

Implementations: the colocated engine (generation.backend = "vllm": grpocli.generation.engine_thread,
its steps on a thread of the training process), and vLLM servers (generation.backend = "vllm-server":
grpocli.generation.server_inflight), the same five calls over HTTP: a group as token ids with its seed;
a sync as vLLM's ``POST /pause?mode=keep``, the weight transfer labelled with the policy version and
``POST /resume``; the spans of vLLM's ``weight_versions`` turned into one version per token
(`token_versions`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from grpocli.generation.base import Generated, Sampling


@dataclass(frozen=True)
class GroupRequest:
    """One prompt's G completions, to generate."""

    serial: int               # the trainer's name for the group (its row's position in the prompt stream)
    prompt_ids: list[int]     # [Tp]
    n: int                    # G
    seed: int | None = None   # completion i samples with seed + i; None: the engine's own generator


@dataclass(frozen=True)
class FinishedGroup:
    """A group whose G completions have all ended, as the engine sampled them."""

    serial: int
    prompt_ids: list[int]            # [Tp]
    completion_ids: list[list[int]]  # [G][Tc]
    truncated: list[bool]            # [G] no EOS within max_tokens
    logprobs: list[list[float]]      # [G][Tc] the engine's log-prob of each sampled token
    versions: list[list[int]]        # [G][Tc] the policy version whose weights sampled each token

    def oldest(self) -> int:
        """The oldest version any of its tokens came from (its first tokens')."""
        return min((v[0] for v in self.versions if v), default=0)


class InflightBackend(Protocol):
    """What the in-flight pipeline asks of an engine (the module docstring says each call)."""

    def submit(self, groups: Sequence[GroupRequest], sampling: Sampling) -> None: ...

    def finished(self, timeout: float | None) -> list[FinishedGroup]: ...

    def sync_weights(self, model: Any, version: int) -> None: ...

    def idle_seconds(self) -> float: ...

    def close(self) -> None: ...


def token_versions(spans: Sequence[Any] | None, length: int, default: int) -> list[int]:
    """One version per token of a completion of ``length`` tokens, from vLLM's WeightVersionSpan
    list (``version`` label, tokens ``[start, end)``); tokens no span covers get ``default`` (vLLM
    reports no spans when it was never given a version)."""
    out = [default] * length
    for span in spans or ():
        out[span.start:span.end] = [int(span.version)] * (min(span.end, length) - span.start)
    return out


def sampled_logprobs(completion: Any) -> list[float]:
    """The log-prob of each sampled token of a vLLM CompletionOutput (vLLM puts it first in each
    position's dict); NaN where it is missing."""
    out = []
    for token, position in zip(completion.token_ids, completion.logprobs or [], strict=False):
        entry = position.get(token) if position else None
        out.append(float(entry.logprob) if entry is not None else float("nan"))
    return out


def group_seed(seed: int, serial: int, n: int) -> int:
    """The seed of group ``serial`` for a run (process) seeded ``seed``: its completions take
    seed + 0..n-1, so two groups' seeds never overlap."""
    return (seed + serial * n) % 2**31


def as_generated(groups: Sequence[FinishedGroup]) -> Generated:
    """The groups as one prompt-major Generated, `[B]` prompts and `[B*G]` completions."""
    return Generated(
        prompt_ids=[g.prompt_ids for g in groups],
        completion_ids=[c for g in groups for c in g.completion_ids],
        truncated=[t for g in groups for t in g.truncated],
        logprobs=[lp for g in groups for lp in g.logprobs],
        versions=[v for g in groups for v in g.versions],
    )


__all__ = ["FinishedGroup", "GroupRequest", "InflightBackend", "as_generated", "group_seed", "sampled_logprobs",
           "token_versions"]
