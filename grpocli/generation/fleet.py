"""Several vLLM servers as one: vllm.server_url = ["http://a:8000", "http://b:8000"].

Generation: the prompts are spread over the live servers by whole groups (all n samples of a
prompt go to one server, in one request), in contiguous, nearly equal shares; the requests go out
at once and the results come back in the prompts' order. Each prompt carries the seed the caller
drew for it, the one it would have with a single server, so how many servers share the work does
not change which seeds sample which prompt.

Weights: every bucket is flattened once and broadcast to all live servers at the same time, each
over its own group (the trainer and that server's workers), so a sync holds one bucket in flight,
not one per server.

Failures: a server that cannot be reached, drops the connection, times out or answers 5xx
(``ServerUnavailable``) stops training with an error naming its URL. With
``vllm.drop_failed_servers = true`` it is dropped instead: a warning on stderr, the metrics
vllm/servers and vllm/servers_dropped, and its prompts re-sent to the others with the same seeds
(its part of a weight update is abandoned). Every server must answer at start, in either mode: a
wrong URL is a mistake to fix, not a server to lose. A 4xx refusal (bad request, API key, wrong
model) is never dropped: every server would refuse the same.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

from grpocli.errors import UserError
from grpocli.generation.base import Generated, Sampling
from grpocli.generation.devices import current_cuda_device, use_device
from grpocli.generation.server_client import ServerClient, ServerUnavailable
from grpocli.generation.weights import (
    DEFAULT_BUCKET_BYTES,
    PolicyWeights,
    buckets,
    flatten_bucket,
)

DROP_HINT = ("restart it (grpo vllm-serve ...), or set vllm.drop_failed_servers = true to train on without "
             "a server that fails")


def spread(count: int, parts: int) -> list[range]:
    """Positions 0..count-1 in ``parts`` contiguous shares whose sizes differ by at most one."""
    size, extra = divmod(count, parts)
    out, start = [], 0
    for k in range(parts):
        end = start + size + (k < extra)
        out.append(range(start, end))
        start = end
    return out


class ServerFleet:
    """The clients of every server in vllm.server_url, called concurrently; failures per the recipe."""

    def __init__(self, clients: list[ServerClient], *, drop_failed: bool = False) -> None:
        self.clients = clients
        self.live = list(clients)
        self.drop_failed = drop_failed
        self.dropped: list[str] = []
        self.prompts_resent = 0

    # -- start ----------------------------------------------------------------------------
    def wait_until_ready(self) -> dict[str, Any]:
        """Every server's readiness (all must answer); the first's, with the transports all of them offer and
        the largest LoRA rank all of them serve."""
        infos = self.each({c: c.wait_until_ready for c in self.clients}, what="start", may_drop=False)
        dtypes = {c.url: infos[c]["dtype"] for c in self.clients}
        if len(set(dtypes.values())) > 1:
            raise UserError(
                "the servers in vllm.server_url hold different dtypes: "
                + ", ".join(f"{url} {dtype}" for url, dtype in dtypes.items()),
                where="vllm.server_url", valid="servers of one model and one --dtype",
                hint="start every server with the same --model and --dtype",
            )
        first = infos[self.clients[0]]
        transports = [t for t in first["transports"] if all(t in infos[c]["transports"] for c in self.clients)]
        return {**first, "transports": transports,
                "lora_rank": min(int(infos[c].get("lora_rank") or 0) for c in self.clients)}

    # -- generation -----------------------------------------------------------------------
    def generate(self, prompt_ids: list[list[int]], n: int, sampling: Sampling, *,
                 seeds: list[int] | None = None) -> Generated:
        """n completions per prompt, prompt-major as from one server; each prompt with its seed."""
        done: dict[int, tuple] = {}  # prompt position -> (prompt ids, completions, truncated, logprobs)
        pending = list(range(len(prompt_ids)))
        while pending:
            shares = {c: [pending[k] for k in share]
                      for c, share in zip(self.live, spread(len(pending), len(self.live)), strict=True) if share}
            answers = self.each({c: partial(c.generate, [prompt_ids[i] for i in share], n, sampling,
                                            seed=None if seeds is None else [seeds[i] for i in share])
                                 for c, share in shares.items()}, what="generation")
            for client, out in answers.items():
                for k, i in enumerate(shares[client]):
                    rows = slice(k * n, (k + 1) * n)
                    done[i] = (out.prompt_ids[k], out.completion_ids[rows], out.truncated[rows],
                               None if out.logprobs is None else out.logprobs[rows])
            pending = sorted(i for c, share in shares.items() if c not in answers for i in share)
            self.prompts_resent += len(pending)
        return _merge([done[i] for i in range(len(prompt_ids))])

    # -- weights --------------------------------------------------------------------------
    def update_weights(self, weights: PolicyWeights, *, transport: str = "gloo",
                       max_bytes: int = DEFAULT_BUCKET_BYTES) -> dict[str, Any]:
        """One update on every live server, each bucket prepared once and sent to all at once.
        Where it fails, the updates opened on the other servers are aborted (their weights then
        count as incomplete until the next complete update)."""
        uids, failed = self.gather({c: partial(c.begin_update, transport) for c in self.live})
        sent = 0
        try:
            uids = self.settle(uids, failed, what="the weight update")
            for bucket in buckets(weights.unique(), max_bytes):
                uids = self._send(uids, bucket, transport)
                sent += len(bucket)
            ends = self.each({c: partial(c.end_update, uid) for c, uid in uids.items()}, what="the weight update")
        except BaseException:
            self.gather({c: partial(c.abort_update, uid) for c, uid in uids.items()})
            raise
        return {**ends[next(iter(ends))], "tensors": sent}  # the tensors sent (a tied lm_head is not)

    def _send(self, uids: dict[ServerClient, str], bucket: list, transport: str) -> dict[ServerClient, str]:
        """One bucket, flattened once, broadcast to every server at once; the updates still open."""
        payload = flatten_bucket(bucket, "cuda" if transport == "nccl" else "cpu")
        sent = self.each({c: partial(c.send_bucket, uid, payload) for c, uid in uids.items()},
                         what="the weight update")
        return {c: uids[c] for c in sent}

    # -- failures -------------------------------------------------------------------------
    def each(self, calls: dict[ServerClient, Callable[[], Any]], *, what: str,
             may_drop: bool = True) -> dict[ServerClient, Any]:
        """Every server's call at once -> {client: result} of those that answered (see settle)."""
        return self.settle(*self.gather(calls), what=what, may_drop=may_drop)

    def gather(self, calls: dict[ServerClient, Callable[[], Any]]) -> tuple[dict, list]:
        """Run the calls at once: ({client: result}, [(client, error)]). One call runs in this thread;
        several in daemon threads (a Ctrl-C does not wait for a slow server to answer), each on this
        thread's CUDA device."""
        outcomes: dict[ServerClient, tuple[bool, Any]] = {}
        device = current_cuda_device()  # NCCL buckets are on this thread's GPU: the senders take it too

        def run(client: ServerClient, call: Callable[[], Any]) -> None:
            try:
                use_device(device)
                outcomes[client] = (True, call())
            except Exception as exc:  # reported to the caller by settle
                outcomes[client] = (False, exc)

        if len(calls) == 1:
            run(*next(iter(calls.items())))
        else:
            threads = [threading.Thread(target=run, args=item, daemon=True, name=f"grpo-fleet {item[0].url}")
                       for item in calls.items()]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        results = {c: outcomes[c][1] for c in calls if outcomes[c][0]}
        return results, [(c, outcomes[c][1]) for c in calls if not outcomes[c][0]]

    def settle(self, results: dict, failed: list, *, what: str, may_drop: bool = True) -> dict[ServerClient, Any]:
        """The results, after the failures: a ServerUnavailable drops its server where allowed;
        any other error, or one that may not be dropped, is raised, naming the server's place in
        the fleet; so is the failure of every server."""
        for client, error in failed:
            if not (may_drop and self.drop_failed and isinstance(error, ServerUnavailable)):
                raise self._named(client, error, what)
        for client, error in failed:
            self._drop(client, error, what)
        if failed and not results:
            raise UserError(f"every server in vllm.server_url failed during {what}: "
                            + "; ".join(str(e).splitlines()[0] for _, e in failed),
                            where="vllm.server_url", hint="restart the servers (grpo vllm-serve ...)")
        return results

    def _named(self, client: ServerClient, error: BaseException, what: str) -> BaseException:
        """The error, saying which server of the fleet failed and what it was doing."""
        if len(self.clients) == 1 or not isinstance(error, UserError):
            return error
        place = f"server {self.clients.index(client) + 1} of {len(self.clients)} in vllm.server_url, during {what}"
        hint = error.hint
        if isinstance(error, ServerUnavailable) and what != "start":
            hint = f"{hint}; or {DROP_HINT}"
        return type(error)(f"{error.what} ({place})", where=error.where, valid=error.valid, hint=hint)

    def _drop(self, client: ServerClient, error: BaseException, what: str) -> None:
        self.live.remove(client)
        self.dropped.append(client.url)
        reason = str(error.what if isinstance(error, UserError) else error).splitlines()[0]
        print(f"warning: dropped the vLLM server at {client.url} after it failed during {what} ({reason}); "
              f"{len(self.live)} of {len(self.clients)} servers left (vllm.drop_failed_servers = true)",
              file=sys.stderr, flush=True)

    def metrics(self) -> dict[str, float]:
        """Live and dropped servers and prompts re-sent so far, with several servers ({} with one)."""
        if len(self.clients) == 1:
            return {}
        return {"vllm/servers": float(len(self.live)), "vllm/servers_dropped": float(len(self.dropped)),
                "vllm/prompts_resent": float(self.prompts_resent)}

    def close(self) -> None:
        pass  # the servers outlive the run; stop each with Ctrl-C


def _merge(rows: list[tuple]) -> Generated:
    """Per-prompt results (prompt ids, completions, truncated, logprobs) in order -> one Generated."""
    logprobs = None if any(r[3] is None for r in rows) else [lp for r in rows for lp in r[3]]
    return Generated(prompt_ids=[r[0] for r in rows], completion_ids=[c for r in rows for c in r[1]],
                     truncated=[t for r in rows for t in r[2]], logprobs=logprobs)


__all__ = ["ServerFleet", "spread"]
