"""The reference model behind `grpo ref-serve`: one thread runs it; requests are batched; weights mix in.

Every job (a log-prob request, a step of a weight update, a download) goes on the queue of one
Worker (grpocli.reference.worker), whose one thread runs them in order, so no forward pass ever sees
half-mixed weights. The worker takes every job that is waiting at once: the sequences of all
waiting log-prob requests (several training processes ask at the same time) are cut, in order,
into forward passes of at most ``max_batch_tokens`` prompt + completion tokens (a longer sequence
gets a pass of its own) and laid out as the trainer lays out micro-batches
(grpocli.algorithms.packing); each pass is the one the in-process reference runs
(grpocli.algorithms.logprobs.sequence_logprobs), so the numbers are the same.

A weight update (``ref_sync_steps``) is a stream: ``begin`` (alpha), buckets of the policy's
tensors, ``end``. Each bucket is mixed in place as it comes (ref = alpha * policy + (1 - alpha) *
ref, grpocli.reference.mixing), so memory stays at one bucket beyond the model; log-prob requests
and downloads wait until the update ends. An update that gets no call for ``timeout`` seconds, or
is aborted or ends incomplete after it mixed some tensors, leaves the weights "damaged": log-prob
requests and downloads are refused (409) with the reason until a complete update with alpha = 1
(which overwrites every tensor, as a resume does) repairs them.

No answer is ever computed from half-mixed weights, nor a checkpoint written from them: the 409 is
given when a request comes and again on the worker thread when its job runs, so a request that
waited behind an update which then expired half-sent is refused too (a copy of the previous
weights to answer from instead would double the model's memory). An answer carries the weights
version its job ran on. Every request waits at most its timeout (504); a job past its deadline
marks the worker stuck and /health says so (503).
"""

from __future__ import annotations

import time
import uuid
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from grpocli.generation.weights import (
    DEFAULT_BUCKET_BYTES,
    Named,
    TensorSpec,
    buckets,
    pack_bucket,
    spec_problems,
)
from grpocli.reference.mixing import mix_tensor, reference_tensors
from grpocli.reference.worker import Job, Worker
from grpocli.serving.access import ServerError
from grpocli.wire.reference import KIND

#: (prompt ids, [completion ids, ...]): one prompt and the completions of its group.
Group = tuple[list[int], list[list[int]]]
#: Job kinds ("score", "download", "begin", "mix", "end", "abort") that read the weights: they wait
#: while an update is mixing them in.
READS_WEIGHTS = ("score", "download")
DEFAULT_MAX_BATCH_TOKENS = 16384


@dataclass
class Update:
    """A weight update in flight: ref = alpha * policy + (1 - alpha) * ref, one bucket at a time."""

    alpha: float
    timeout: float
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    started: float = field(default_factory=time.monotonic)
    last: float = field(default_factory=time.monotonic)  # the last call that touched it
    mixed: set[str] = field(default_factory=set)


class ReferenceHost:
    """The reference model, driven by one worker thread (module docstring)."""

    def __init__(self, model: Any, *, max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
                 request_timeout: float = 600.0, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
        from grpocli.algorithms.packing import choose_layout

        self.model = model
        self.layout = choose_layout(model)
        weights = reference_tensors(model)
        self.tensors = dict(weights.unique())
        self.aliases = weights.aliases  # a tied tensor's other name (lm_head -> embed_tokens) is accepted too
        self.specs = {name: TensorSpec.of(name, t) for name, t in self.tensors.items()}
        self.vocab_size = int(model.get_input_embeddings().num_embeddings)
        self.max_batch_tokens, self.request_timeout, self.bucket_bytes = max_batch_tokens, request_timeout, bucket_bytes
        self.update: Update | None = None
        self.version = 0              # complete updates so far
        self.damaged: str | None = None
        self.batches = 0              # forward passes so far (/info; tests see the batching)
        self.held: list[Job] = []     # jobs that read the weights, waiting for an update to end
        self.worker = Worker("grpo-reference", self._schedule, wait=self._patience, subject="the reference model",
                             worker="the reference worker", restart="grpo ref-serve",
                             device=next(model.parameters()).device)  # a GPU: the worker thread's current device

    # -- request threads ------------------------------------------------------------------
    def logprobs(self, groups: list[Group], temperature: float, timeout: float) -> tuple[list[list[list[float]]], int]:
        """Per group, per completion: log p(token | prefix) of each completion token at ``temperature``;
        and the weights version they were computed on."""
        for g, (prompt, completions) in enumerate(groups):
            for ids in (prompt, *completions):
                bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
                if bad is not None:
                    raise ServerError(400, f"groups[{g}]: token id {bad} is outside the model's vocabulary "
                                           f"(0 .. {self.vocab_size - 1})")
        if self.damaged:
            raise ServerError(409, self.damaged)
        return self._submit(Job("score", (groups, temperature)), timeout)

    def begin(self, alpha: float, timeout: float) -> str:
        return self._submit(Job("begin", (alpha, timeout)), timeout)

    def mix(self, update_id: str, named: list[Named], timeout: float) -> int:
        named = [(self.aliases.get(n, n), t) for n, t in named]
        got = [TensorSpec(n, tuple(t.shape), self.specs[n].dtype if n in self.specs else "float32") for n, t in named]
        problems = spec_problems(self.specs, got, complete=False)
        if problems:
            raise ServerError(400, "the bucket does not fit the reference model: " + "; ".join(problems))
        return self._submit(Job("mix", (update_id, named)), timeout)

    def end(self, update_id: str, timeout: float) -> dict[str, Any]:
        return self._submit(Job("end", (update_id,)), timeout)

    def abort(self, update_id: str, timeout: float) -> dict[str, Any]:
        return self._submit(Job("abort", (update_id,)), timeout)

    def download(self, index: int, timeout: float) -> tuple[bytes, int, int]:
        """Bucket ``index`` of the current weights (each tensor once) as safetensors, the count, and the
        weights version it was read from (a client reading several checks they are one version)."""
        if self.damaged:
            raise ServerError(409, self.damaged)
        return self._submit(Job("download", (index,)), timeout)

    def info(self) -> dict[str, Any]:
        from grpocli.generation.weights import dtype_name

        param = next(iter(self.tensors.values()))
        return {"kind": KIND, "dtype": dtype_name(param.dtype), "device": str(param.device),
                "vocab_size": self.vocab_size, "weights_version": self.version, "damaged": self.damaged,
                "max_batch_tokens": self.max_batch_tokens, "layout": self.layout.kind, "batches": self.batches,
                "waiting": self.worker.waiting() + len(self.held), "updating": self.update is not None,
                "tensors": len(self.tensors)}

    def health(self) -> str | None:
        """None when the worker takes jobs, else why not (dead, or stuck past a deadline)."""
        return self.worker.health()

    def _submit(self, job: Job, timeout: float) -> Any:
        try:
            return self.worker.ask(job, timeout)
        except FutureTimeout:
            job.future.cancel()  # not started: the worker skips it
            raise ServerError(504, f"the reference model did not answer within {timeout:g} s "
                                   f"({self.worker.waiting()} jobs waiting)") from None

    # -- the worker thread ------------------------------------------------------------------
    def _patience(self) -> float | None:
        """How long the worker waits for a job: not at all when held jobs may go, until an open
        update expires, else until one comes."""
        u = self.update
        if u is None:
            return 0.0 if self.held else None
        return max(u.last + u.timeout - time.monotonic(), 0.01)

    def _schedule(self, jobs: list[Job]) -> None:
        """The worker's schedule: the jobs that came ([] after a wait of ``_patience`` without one).
        An open update that got no call for its timeout expires; held jobs go once no update is open."""
        u = self.update
        if not jobs and u is not None and time.monotonic() >= u.last + u.timeout:
            self._close_update(u, f"it got no call for {u.timeout:g} s")
        if self.update is None:
            jobs, self.held = self.held + jobs, []
        self.held += self._run(jobs)

    def _run(self, jobs: list[Job]) -> list[Job]:
        """Run jobs in order, consecutive log-prob requests together; those that must wait are returned."""
        held, scores = [], []
        for job in jobs:
            if job.kind in READS_WEIGHTS and self.update is not None:
                held.append(job)
            elif job.kind == "score":
                scores.append(job)
            else:
                self._score(scores)
                scores = []
                self._one(job)
        self._score(scores)
        return held

    def _one(self, job: Job) -> None:
        self.worker.run(job, getattr(self, f"_do_{job.kind}"), *job.args, label=f"a {job.kind} job",
                        limit=self.request_timeout)

    def _score(self, jobs: list[Job]) -> None:
        """Every waiting log-prob request's sequences in forward passes under the token budget; each
        answered with the weights version, or refused (409) if an update left the weights damaged
        since the request came."""
        live = [job for job in jobs if job.future.set_running_or_notify_cancel()]
        if self.damaged:
            for job in live:
                job.future.set_exception(ServerError(409, self.damaged))
            return
        for temperature in dict.fromkeys(job.args[1] for job in live):
            same = [job for job in live if job.args[1] == temperature]
            try:
                with self.worker.busy("a log-prob job", self.request_timeout):
                    answers = self._logprobs([g for job in same for g in job.args[0]], temperature)
            except Exception as exc:  # noqa: BLE001 - fails these requests (500 with the reason), not the worker
                for job in same:
                    job.future.set_exception(exc)
                continue
            k = 0
            for job in same:
                job.future.set_result((answers[k : k + len(job.args[0])], self.version))
                k += len(job.args[0])

    def _logprobs(self, groups: list[Group], temperature: float) -> list[list[list[float]]]:
        import torch

        from grpocli.algorithms.logprobs import sequence_logprobs
        from grpocli.algorithms.packing import build_rows

        out: list[list[list[float]]] = [[[] for _ in completions] for _, completions in groups]
        seqs = [(g, j, prompt, c) for g, (prompt, completions) in enumerate(groups)
                for j, c in enumerate(completions) if c]
        for batch in token_batches([len(p) + len(c) for _, _, p, c in seqs], self.max_batch_tokens):
            rows = build_rows([(seqs[i][0], seqs[i][2], seqs[i][3]) for i in batch], self.layout)
            with torch.no_grad():  # the in-process reference pass
                logp, _ = sequence_logprobs(self.model, rows, temperature)
            self.batches += 1
            for row, i in enumerate(batch):
                g, j, _, completion = seqs[i]
                out[g][j] = logp[row, : len(completion)].tolist()
        return out

    # -- weight updates (on the worker thread) -------------------------------------------------
    def _current(self, update_id: str) -> Update:
        u = self.update
        if u is None or u.id != update_id:
            raise ServerError(409, f"no weight update {update_id} is open (it ended, expired or was aborted)")
        u.last = time.monotonic()
        return u

    def _do_begin(self, alpha: float, timeout: float) -> str:
        if self.update is not None:
            raise ServerError(409, f"another weight update is open (for {time.monotonic() - self.update.started:.0f} s)")
        self.update = Update(alpha=alpha, timeout=timeout)
        return self.update.id

    def _do_mix(self, update_id: str, named: list[Named]) -> int:
        u = self._current(update_id)
        names = [name for name, _ in named]
        again = sorted({name for k, name in enumerate(names) if name in u.mixed or name in names[:k]})
        if again:
            raise ServerError(400, f"tensors sent twice in one update: {', '.join(again[:4])}")
        for name, tensor in named:
            mix_tensor(self.tensors[name], tensor, u.alpha)
            u.mixed.add(name)
        u.last = time.monotonic()
        return len(named)

    def _do_end(self, update_id: str) -> dict[str, Any]:
        u = self._current(update_id)
        missing = sorted(set(self.tensors) - u.mixed)
        if missing:
            self._close_update(u, f"it ended without {len(missing)} of the model's tensors ({', '.join(missing[:4])})")
            raise ServerError(409, self.damaged or "the update ended incomplete")
        self.update = None
        self.version += 1
        if u.alpha == 1.0:
            self.damaged = None  # every tensor overwritten
        return {"weights_version": self.version, "tensors": len(u.mixed), "seconds": time.monotonic() - u.started}

    def _do_abort(self, update_id: str) -> dict[str, Any]:
        self._close_update(self._current(update_id), "the client aborted it")
        return {"aborted": True, "damaged": self.damaged}

    def _close_update(self, u: Update, why: str) -> None:
        self.update = None
        if u.mixed:
            self.damaged = (f"the reference weights are partly mixed: a weight update mixed {len(u.mixed)} of "
                            f"{len(self.tensors)} tensors, then {why}; a complete update with alpha = 1 "
                            "(grpo train resuming from a checkpoint) or a restart of grpo ref-serve repairs them")

    def _do_download(self, index: int) -> tuple[bytes, int, int]:
        if self.damaged:  # a checkpoint of half-mixed weights would restore them on resume
            raise ServerError(409, self.damaged)
        parts = list(buckets(self.tensors.items(), self.bucket_bytes))
        if not 0 <= index < len(parts):
            raise ServerError(404, f"bucket {index} does not exist (the weights are {len(parts)} buckets)")
        return pack_bucket(parts[index]), len(parts), self.version


def token_batches(costs: list[int], max_tokens: int) -> list[list[int]]:
    """Indices of ``costs``, in order, in runs of at most ``max_tokens`` (a bigger one alone)."""
    out: list[list[int]] = []
    used = 0
    for i, cost in enumerate(costs):
        if not out or used + cost > max_tokens:
            out.append([])
            used = 0
        out[-1].append(i)
        used += cost
    return out


__all__ = ["DEFAULT_MAX_BATCH_TOKENS", "Group", "ReferenceHost", "token_batches"]
