"""algorithm.reference = "server": the trainer's side of `grpo ref-serve`.

``Session.reference`` is a ``ReferenceClient`` then, not a model: phase 5 of the loop calls
``micro_batch_logprobs`` (one request per optimizer slice and process, the server batches what
arrives together),
the refresh of ``ref_sync_steps`` calls ``refresh`` (the main process streams the policy's weights
in buckets, the server mixes them into its own: the trainer never holds the reference weights),
and checkpoints save and restore the moving reference through ``state_dict`` / ``load_state_dict``
(the main process downloads it into the checkpoint, and on resume sends it back with alpha = 1),
so grpocli.trainer.checkpoint treats it as it treats a local reference model.

Every call has a timeout (``algorithm.reference_timeout``) that ends in a UserError naming the URL
and what to do. The API key, if the server has one, is read from GRPO_REF_API_KEY (an environment
variable, so it is never written to config.resolved.toml). The protocol is grpocli/wire/reference.py's,
spoken through grpocli.wire.client.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, Any

import torch

from grpocli.errors import UserError
from grpocli.generation.weights import (
    DEFAULT_BUCKET_BYTES,
    buckets,
    dtype_from_name,
    pack_bucket,
    policy_weights,
)
from grpocli.parallel import Parallel
from grpocli.wire import reference as wire
from grpocli.wire.client import BadAnswer, Client, Refused, Unavailable, read_answer

if TYPE_CHECKING:
    from grpocli.recipe.algorithm_section import AlgorithmSection

KEY_ENV = wire.KEY_ENV
START_HINT = ("start one: grpo ref-serve --model MODEL_DIR --port 8001 (MODEL_DIR: the policy's starting "
              "weights), and set algorithm.reference_url = 'http://127.0.0.1:8001'")


def start_hint(where: str) -> str:
    """How to start the server the recipe key ``where`` names."""
    if where == "algorithm.reference_url":
        return START_HINT
    return f"start one: grpo ref-serve --model MODEL_DIR --port 8001, and set {where} = 'http://127.0.0.1:8001'"


class ReferenceClient:
    """A `grpo ref-serve` standing in for the reference model (module docstring)."""

    def __init__(self, url: str, *, timeout: float, api_key: str | None = None,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, parallel: Parallel | None = None,
                 where: str = "algorithm.reference_url") -> None:
        self.http = Client(url, timeout=timeout, api_key=api_key)
        self.where = where  # the recipe key that names the server (a teacher's is distill.teacher)
        self.url, self.timeout, self.api_key, self.bucket_bytes = self.http.url, timeout, api_key, bucket_bytes
        self.parallel = parallel or Parallel.alone()  # which training process sends, and waiting for it
        self.info: dict[str, Any] = {}

    @classmethod
    def connect(cls, algorithm: AlgorithmSection, parallel: Parallel | None = None) -> ReferenceClient:
        """Wait for the server of [algorithm]'s reference_url and check that it is one."""
        client = cls(algorithm.reference_url, timeout=algorithm.reference_timeout, api_key=os.environ.get(KEY_ENV),
                     parallel=parallel)
        client.wait_until_ready()
        if client.info.get("weights_version") or client.info.get("damaged"):
            print(f"warning: the reference server at {client.url} holds weights changed by "
                  f"{client.info.get('weights_version')} weight updates (an earlier run's ref_sync_steps), not "
                  "those it started with; a new run should restart grpo ref-serve", file=sys.stderr, flush=True)
        return client

    # -- HTTP ----------------------------------------------------------------------------
    def call(self, method: str, path: str, body: Any = None, *, timeout: float | None = None,
             answer: Any = None, raw: bool = False) -> Any:
        """The answer as JSON, as the ``answer`` model, or (``raw``) as (bytes, headers); failures as UserError."""
        timeout = self.timeout if timeout is None else timeout
        try:
            if raw:
                reply = self.http.send(method, path, body, timeout=timeout)
                return reply.content, reply.headers
            return self.http.call(method, path, body, answer=answer, timeout=timeout)
        except Refused as exc:
            raise self._refused(exc) from None
        except Unavailable as exc:
            if exc.timed_out:
                raise UserError(f"grpo ref-serve at {self.url} did not answer {method} {path} within {timeout:g} s",
                                where="algorithm.reference_timeout",
                                valid="a longer timeout, or a server that is not stuck",
                                hint="raise algorithm.reference_timeout, and look at the server's terminal") from None
            raise UserError(f"no grpo ref-serve answers at {self.url} ({exc.reason})", where=self.where,
                            valid="the URL of a running `grpo ref-serve`", hint=start_hint(self.where)) from None
        except BadAnswer as exc:
            raise self._bad(method, path, exc) from None

    def _bad(self, method: str, path: str, exc: BadAnswer) -> UserError:
        return UserError(f"grpo ref-serve at {self.url} answered {method} {path} outside its protocol: {exc.what}",
                         where=f"{exc.field} of the answer", valid=f"an answer of grpo ref-serve, protocol "
                         f"{wire.PROTOCOL_VERSION}", hint=f"is {self.url} a grpo ref-serve of this grpo version? "
                         f"{start_hint(self.where)}")

    def _refused(self, exc: Refused) -> UserError:
        hint = {401: f"export {KEY_ENV}=<the server's --api-key> before grpo train",
                400: "the server's model must be the policy's: grpo ref-serve --model <the model you train>"}.get(
            exc.status, "look at the server's terminal for the full error")
        return UserError(f"grpo ref-serve at {self.url} refused {exc.method} {exc.path}: HTTP {exc.status}: "
                         f"{exc.detail}", where=self.where, hint=hint)

    def wait_until_ready(self) -> dict[str, Any]:
        """Poll /health until the server answers (it may still be loading), then read /info."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                self.call("GET", wire.HEALTH_PATH, timeout=min(5.0, self.timeout))
                break
            except UserError as err:
                if "HTTP 401" in err.what or time.monotonic() + 1.0 > deadline:
                    raise
                time.sleep(1.0)
        info = self.call("GET", wire.INFO_PATH)
        if not isinstance(info, dict) or info.get("kind") != wire.KIND or info.get("protocol") != wire.PROTOCOL_VERSION:
            raise UserError(f"the server at {self.url} is not a grpo ref-serve of protocol {wire.PROTOCOL_VERSION}",
                            where=self.where, valid="the URL of a `grpo ref-serve` of this grpo version",
                            hint=start_hint(self.where))
        try:
            self.info = read_answer(wire.ReferenceInfo, info).model_dump()
        except BadAnswer as exc:
            raise self._bad("GET", wire.INFO_PATH, exc) from None
        return self.info

    # -- log-probs -----------------------------------------------------------------------
    def logprobs(self, groups: list[tuple[list[int], list[list[int]]]], temperature: float) -> list[list[list[float]]]:
        """Per group (prompt ids, completions' ids), per completion: the reference log-prob of each token."""
        body = wire.LogprobRequest.model_construct(  # unchecked, as every request here: the server checks it
            groups=[wire.SequenceGroup.model_construct(prompt_ids=list(p), completion_ids=[list(c) for c in cs])
                    for p, cs in groups], temperature=temperature)
        return self.call("POST", wire.LOGPROBS_PATH, body, answer=wire.LogprobAnswer).logprobs

    def micro_batch_logprobs(self, part: Any, micro_batches: tuple[Any, ...], temperature: float) -> tuple[torch.Tensor, ...]:
        """The reference log-probs `[n, T]` of each micro-batch of ``part`` (a trainer Rollouts), as
        the in-process reference pass gives them: each completion token's, 0 where the loss mask is 0."""
        g = part.group_size
        groups: list[tuple[int, list[list[int]]]] = []  # consecutive completions of one group share a prompt
        for mb in micro_batches:
            for i in mb.index.tolist():
                if not groups or groups[-1][0] != i // g:
                    groups.append((i // g, []))
                groups[-1][1].append(part.completion_ids[i])
        if not groups:
            return ()
        answered = self.logprobs([(part.prompt_ids[k], cs) for k, cs in groups], temperature)
        self._check_counts(answered, groups, g)
        answers = iter([lp for per in answered for lp in per])
        out = []
        for mb in micro_batches:
            logp = torch.zeros(mb.loss_mask.shape, dtype=torch.float32)  # [n, T]
            for row in range(logp.shape[0]):
                values = next(answers)
                logp[row, : len(values)] = torch.tensor(values, dtype=torch.float32)
            out.append(logp.masked_fill_(mb.loss_mask <= 0, 0.0))
        return tuple(out)

    def _check_counts(self, answered: list[list[list[float]]], groups: list[tuple[int, list[list[int]]]],
                      group_size: int) -> None:
        """UserError naming the first row whose answer does not hold one log-prob per completion token."""
        if len(answered) != len(groups):
            raise UserError(f"the server at {self.url} answered {len(answered)} groups of log-probs for "
                            f"{len(groups)} asked", where=self.where, valid="one list per group asked",
                            hint="is it a grpo ref-serve of this grpo version? look at its terminal")
        for (k, completions), per in zip(groups, answered):
            if len(per) != len(completions):
                raise UserError(f"the server at {self.url} answered {len(per)} completions for prompt {k} "
                                f"(rollout rows {k * group_size}..{(k + 1) * group_size - 1}), {len(completions)} asked",
                                where=self.where, valid="one list per completion",
                                hint="look at the server's terminal")
            for j, (ids, values) in enumerate(zip(completions, per)):
                if len(values) != len(ids):
                    raise UserError(f"the server at {self.url} answered {len(values)} log-probs for a completion "
                                    f"of {len(ids)} tokens (prompt {k}, its completion {j} in the request)",
                                    where=self.where, valid="one log-prob per completion token",
                                    hint="is the server's model the one it should be? look at its terminal")

    # -- weights -------------------------------------------------------------------------
    def refresh(self, model: Any, alpha: float) -> None:
        """ref = alpha * policy + (1 - alpha) * ref on the server: the main process sends, all wait."""
        with policy_weights(model, dtype_from_name(self.info.get("dtype", "float32")), self.parallel) as weights:
            if self.parallel.main:
                self.send(weights.unique(), alpha)
            else:
                weights.take_part()  # FSDP2: each tensor the main process sends is gathered by all
        self.parallel.wait()

    def send(self, named: Any, alpha: float) -> dict[str, Any]:
        """Stream tensors (name, tensor) to the server in buckets, to be mixed in with ``alpha``."""
        uid = self.call("POST", wire.BEGIN_PATH, wire.BeginMix.model_construct(alpha=alpha, timeout=self.timeout),
                        answer=wire.MixBegun).update_id
        try:
            for bucket in buckets(named, self.bucket_bytes):
                self.call("POST", f"{wire.BUCKET_PATH}?update_id={uid}", pack_bucket(bucket))
            return self.call("POST", wire.END_PATH, wire.UpdateId.model_construct(update_id=uid))
        except BaseException:
            try:  # leave the server free for the next update (it reports the weights as damaged)
                self.call("POST", wire.ABORT_PATH, wire.UpdateId.model_construct(update_id=uid), timeout=min(self.timeout, 10.0))
            except UserError:
                pass
            raise

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The server's current weights, each tensor once (main process; the others get {})."""
        from grpocli.generation.weights import unpack_bucket

        if not self.parallel.main:
            return {}
        out: dict[str, torch.Tensor] = {}
        index, count, versions = 0, 1, set()
        while index < count:
            data, headers = self.call("GET", f"{wire.BUCKET_PATH}?index={index}", raw=True)
            count = int(headers.get(wire.BUCKET_COUNT_HEADER.lower(), "1"))
            versions.add(headers.get(wire.VERSION_HEADER.lower()))
            out.update(unpack_bucket(data))
            index += 1
        if len(versions) > 1:  # a weight update ended between two buckets: not one set of weights
            raise UserError(f"the reference weights at {self.url} changed while they were downloaded (weights "
                            f"versions {', '.join(sorted(map(str, versions)))}): another client updated them",
                            where=self.where, valid="a grpo ref-serve that serves this run alone",
                            hint="give each run its own grpo ref-serve, and resume from the last checkpoint")
        return out

    def load_state_dict(self, state_dict: dict[str, torch.Tensor], strict: bool = True) -> tuple[list, list]:
        """Replace the server's weights (alpha = 1) with a checkpoint's: the main process sends, all wait."""
        if self.parallel.main:
            self.send(_each_storage_once(state_dict), 1.0)
        self.parallel.wait()
        return [], []


def _each_storage_once(state_dict: dict[str, torch.Tensor]) -> Any:
    """(name, tensor) pairs, a tied tensor (lm_head = embed_tokens) once: the server mixes each once."""
    seen = set()
    for name, tensor in state_dict.items():
        key = (tensor.untyped_storage().data_ptr() + tensor.storage_offset() * tensor.element_size(),
               tuple(tensor.shape))
        if key not in seen:
            seen.add(key)
            yield name, tensor


__all__ = ["KEY_ENV", "ReferenceClient"]
