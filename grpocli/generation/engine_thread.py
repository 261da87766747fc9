"""The colocated engine generating in flight (generation.pipeline = "inflight", backend "vllm"): one
thread of the training process owns the engine's steps (vLLM's ``LLMEngine``: ``add_request``,
``step``), and the trainer submits groups, takes finished ones and syncs weights between two steps.

* Each completion is its own request (n = 1) with seed ``group.seed + i``, the seeds vLLM's own
  n-sampling gives a group, so a group repeats its tokens for its seed however the engine batches it.
* A weight sync parks the thread between two engine steps (every request kept: vLLM's pause with
  mode "keep"), loads the weights on the trainer's thread, labels the engine's weights with the new
  version (``set_weight_version``: finished outputs carry ``weight_versions`` spans) and lets the
  thread step again: requests in flight continue with the new weights.
* The KV cache of the requests in flight was computed by the old weights. generation.inflight_kv_cache
  = "keep" (the default, vLLM's pause mode "keep", PipelineRL's choice) leaves it: a token after the
  sync is sampled by the new weights attending over keys and values the old ones computed, and its
  engine log-prob is the probability it was sampled with, which is what the importance ratio needs;
  cached prompt prefixes of the old weights may serve new requests the same way. "recompute" resets
  it with ``reset_running_requests=True`` (vLLM resets no cache that running requests hold
  otherwise): each request keeps its tokens and its sampler's state, and its prompt and tokens so far
  are computed again (one prefill) by the new weights before its next token, so a token labelled
  version v was sampled from version v's weights alone, at the cost of that prefill every sync.
* The engine must step synchronously (no batch queue): a queued batch of the old weights would be
  labelled with the new version. vLLM on a CPU and under the external launcher does; it is checked.
* The thread takes the process's CUDA device and torch thread count first (vLLM's CPU attention
  refuses another thread count than the engine was built with: grpocli.generation.devices).

Evaluation during training (`grpo train`'s eval.every) generates through the same thread (`generate`),
so no caller but this thread steps the engine while it runs.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from grpocli.errors import UserError
from grpocli.generation.base import Generated, Sampling
from grpocli.generation.devices import adopt_thread
from grpocli.generation.inflight import FinishedGroup, GroupRequest, sampled_logprobs, token_versions


@dataclass
class _Partial:
    """A group while its completions end one by one."""

    prompt_ids: list[int]
    outputs: list[Any]                          # [G] vLLM's CompletionOutput once ended, else None
    ended: int = 0
    private: bool = False                       # `generate`'s own (evaluation), not the pipeline's
    version_at_start: int = field(default=0)


class EngineThread:
    """InflightBackend (grpocli.generation.inflight) on a colocated engine (``VllmEngine``).

    ``load(model)`` loads a policy's weights into the engine (the backend's weight sync, with the
    requests in flight computed again); ``version``: the policy version the engine holds now.
    """

    def __init__(self, engine: Any, *, load: Callable[[Any], None], version: int, device: Any = None,
                 threads: int = 1) -> None:
        self.engine, self.load, self.version = engine, load, version
        self.core = engine.llm.llm_engine
        check_synchronous(self.core)
        self.core.set_weight_version(str(version))
        self.cv = threading.Condition()
        self.inbox: list[tuple[str, dict[str, Any], Any]] = []  # (request id, prompt, SamplingParams) to add
        self.groups: dict[int, _Partial] = {}
        self.done: deque[FinishedGroup] = deque()      # the pipeline's finished groups, in the order they ended
        self.answers: dict[int, FinishedGroup] = {}    # `generate`'s
        self.next_private = -1
        self.pause_wanted = self.parked = self.stopping = False
        self.error: BaseException | None = None
        self.idle = 0.0
        self.steps = 0                                  # engine steps taken
        self.thread = threading.Thread(target=self._run, args=(device, threads), name="grpo-engine", daemon=True)
        self.thread.start()

    # -- the trainer's side --------------------------------------------------------------
    def submit(self, groups: Sequence[GroupRequest], sampling: Sampling) -> None:
        with self.cv:
            self._raise()
            for group in groups:
                self._queue(group, sampling, private=False)
            self.cv.notify_all()

    def finished(self, timeout: float | None) -> list[FinishedGroup]:
        with self.cv:
            self.cv.wait_for(lambda: self.done or self.error is not None, timeout)
            self._raise()
            out = list(self.done)
            self.done.clear()
        return out

    def sync_weights(self, model: Any, version: int) -> None:
        """Park the thread between two engine steps, load the weights, label them, resume."""
        with self.cv:
            self._raise()
            self.pause_wanted = True
            self.cv.notify_all()
            self.cv.wait_for(lambda: self.parked or self.error is not None)
            self._raise()
        try:
            self.load(model)
            self.core.set_weight_version(str(version))
            self.version = version
        finally:
            with self.cv:
                self.pause_wanted = False
                self.cv.notify_all()

    def idle_seconds(self) -> float:
        with self.cv:
            return self.idle

    def generate(self, prompt_ids: list[list[int]], n: int, sampling: Sampling) -> Generated:
        """n completions of each prompt, generated beside the groups in flight (evaluation); waits."""
        with self.cv:
            self._raise()
            serials = []
            for ids in prompt_ids:
                serials.append(self.next_private)
                self._queue(GroupRequest(self.next_private, list(ids), n), sampling, private=True)
                self.next_private -= 1
            self.cv.notify_all()
            self.cv.wait_for(lambda: all(s in self.answers for s in serials) or self.error is not None)
            self._raise()
            groups = [self.answers.pop(s) for s in serials]
        return Generated(prompt_ids=[g.prompt_ids for g in groups],
                         completion_ids=[c for g in groups for c in g.completion_ids],
                         truncated=[t for g in groups for t in g.truncated],
                         logprobs=[lp for g in groups for lp in g.logprobs])

    def close(self) -> None:
        """Stop the thread and abort every request it still has."""
        with self.cv:
            self.stopping = True
            self.cv.notify_all()
        self.thread.join()
        ids = [f"{serial}:{i}" for serial, group in self.groups.items() for i, out in enumerate(group.outputs)
               if out is None]
        if ids and self.error is None:
            self.core.abort_request(ids)
        self.groups.clear()

    # -- the engine's thread -------------------------------------------------------------
    def _run(self, device: Any, threads: int) -> None:
        adopt_thread(device, threads)
        try:
            while self._wait_for_work():
                with self.cv:
                    adds, self.inbox = self.inbox, []
                for request_id, prompt, params in adds:
                    self.core.add_request(request_id, self.core.renderer.render_cmpl([prompt])[0], params)
                ended = [out for out in self.core.step() if out.finished]
                with self.cv:
                    self.steps += 1
                    for out in ended:
                        self._ended(out)
                    self.cv.notify_all()
        except BaseException as exc:  # said to the trainer at its next call
            with self.cv:
                self.error = exc
                self.cv.notify_all()

    def _wait_for_work(self) -> bool:
        """Park while a sync is wanted; wait (idle) while there is nothing to generate; False: stop."""
        with self.cv:
            while not self.stopping:
                if self.pause_wanted:
                    self.parked = True
                    self.cv.notify_all()
                    self.cv.wait_for(lambda: not self.pause_wanted or self.stopping)
                    self.parked = False
                elif self.inbox or self.core.has_unfinished_requests():
                    return True
                else:
                    t0 = time.perf_counter()
                    self.cv.wait()
                    self.idle += time.perf_counter() - t0
            return False

    def _queue(self, group: GroupRequest, sampling: Sampling, *, private: bool) -> None:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            n=1, max_tokens=sampling.max_tokens, temperature=sampling.temperature, top_p=sampling.top_p,
            top_k=sampling.top_k or 0, min_p=sampling.min_p, repetition_penalty=sampling.repetition_penalty,
            stop=list(sampling.stop) or None, logprobs=0, output_kind=RequestOutputKind.FINAL_ONLY)
        self.groups[group.serial] = _Partial(list(group.prompt_ids), [None] * group.n, private=private,
                                             version_at_start=self.version)
        for i in range(group.n):
            p = params.clone()
            p.seed = None if group.seed is None else group.seed + i
            self.inbox.append((f"{group.serial}:{i}", {"prompt_token_ids": list(group.prompt_ids)}, p))

    def _ended(self, out: Any) -> None:
        serial, index = (int(x) for x in out.request_id.split(":"))
        group = self.groups[serial]
        group.outputs[index] = out.outputs[0]
        group.ended += 1
        if group.ended < len(group.outputs):
            return
        del self.groups[serial]
        done = FinishedGroup(
            serial=serial, prompt_ids=group.prompt_ids,
            completion_ids=[list(c.token_ids) for c in group.outputs],
            truncated=[c.finish_reason == "length" for c in group.outputs],
            logprobs=[sampled_logprobs(c) for c in group.outputs],
            versions=[token_versions(c.weight_versions, len(c.token_ids), group.version_at_start)
                      for c in group.outputs])
        if group.private:
            self.answers[serial] = done
        else:
            self.done.append(done)

    def _raise(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"the generation engine's thread stopped: {self.error!r}") from self.error
        if not self.thread.is_alive() and not self.stopping:
            raise RuntimeError("the generation engine's thread stopped")


def check_synchronous(core: Any) -> None:
    """UserError where the engine queues batches ahead (vLLM's async scheduling): a sync between two
    steps would then label a queued batch of the old weights with the new version."""
    inner = getattr(getattr(core, "engine_core", None), "engine_core", None)
    if getattr(inner, "batch_queue", None) is not None:
        raise UserError(
            "the colocated vLLM engine queues batches ahead of its steps (vLLM's async scheduling), which "
            "generation.pipeline = \"inflight\" cannot label with the weights that sampled them",
            where="generation.pipeline", valid="an engine that steps synchronously (async_scheduling off)",
            hint="report this as a bug in grpo (the in-flight engine is started with async_scheduling=False)")


__all__ = ["EngineThread", "check_synchronous"]
