"""The trainer's client of one vLLM server: stock `vllm serve` (vLLM >= 0.32) in dev mode with a
weight-transfer engine, as `grpo vllm-serve` starts it. Generation goes through /v1/completions from
token ids (and /inference/v1/generate in flight, which says which weights sampled each token), weights
through vLLM's RL API (grpocli/wire/vllm_api.py lists the paths).

    grpo vllm-serve --model MODEL                                           # all of the below
    VLLM_SERVER_DEV_MODE=1 vllm serve MODEL --weight-transfer-config '{"backend": "nccl"}' \\
        --logprobs-mode processed_logprobs                    # GPUs (TRL's command)
    ... --weight-transfer-config '{"backend": "grpo_gloo"}'    # no GPU: grpocli.generation.gloo_transfer

Before training, what the server lacks is named with the flag to add: dev mode (the RL API's routes),
a weight-transfer engine, processed log-probs (raw ones bias the importance-sampling correction, as
TRL 1.16 warns), a vLLM older than the RL API. Weights: the trainer hosts the group's TCPStore as
rank 0 (a free port on the address the server reaches it by) and the server's workers join it; each
bucket is announced by POST /update_weights while it is broadcast, as vLLM's own NCCL engine does.

Every call goes through grpocli.wire.client with a timeout (``vllm.server_timeout``) that bounds the
whole answer and ends in a UserError naming the URL and what to do, never a hang. The API key, if the
server has one, is sent as a Bearer token (the backend reads it from GRPO_VLLM_API_KEY). Failures come
in two kinds: ``ServerUnavailable`` (no answer: refused or dropped connection, time up, HTTP 5xx), which
a fleet may drop the server for (grpocli.generation.fleet), and any other UserError (a 4xx refusal, an
answer outside the protocol), which every server would give alike.
"""

from __future__ import annotations

import contextlib
import socket
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from grpocli.errors import UserError
from grpocli.generation.base import Generated, Sampling
from grpocli.generation.inflight import FinishedGroup, GroupRequest, token_versions
from grpocli.wire import vllm_api as api
from grpocli.wire.client import BadAnswer, Client, Refused, Unavailable

#: The engine's --weight-transfer-config backend -> grpo's transport over it.
TRANSPORTS = {"grpo_gloo": "gloo", "nccl": "nccl"}
START_HINT = "start one: grpo vllm-serve --model MODEL_DIR --port 8000 (and vllm.server_url = 'http://127.0.0.1:8000')"
#: Host names that are this machine.
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
RESTART = ("restart it with grpo vllm-serve --model MODEL, or: VLLM_SERVER_DEV_MODE=1 vllm serve MODEL "
           "--weight-transfer-config '{\"backend\": \"grpo_gloo\"}' (\"nccl\" on GPUs) --logprobs-mode processed_logprobs")


class ServerUnavailable(UserError):
    """The server did not answer: refused or dropped the connection, timed out, or failed (HTTP 5xx).
    A fleet may drop such a server (vllm.drop_failed_servers); a 4xx refusal is never dropped."""


class ServerClient:
    """Calls to one vLLM server; each bounded by ``timeout`` seconds, failures as UserError."""

    kind = "vLLM server"
    stalled_hint = "look at the server's terminal"

    def __init__(self, url: str, *, timeout: float, api_key: str | None = None) -> None:
        self.http = Client(url, timeout=timeout, api_key=api_key)
        self.url, self.timeout, self.api_key = self.http.url, timeout, api_key
        self.group: Any = None
        self.store: Any = None  # the group's TCPStore, hosted here: it lives as long as the group
        self.model = self.base_model = ""  # what requests name: the served model, or the latest adapter
        self.versions = 0
        self.label: int | None = None  # in flight: the trainer's policy version of the weights being sent
        self.recompute = False          # in flight: the requests kept recompute their KV cache after a sync
        self.pool = ThreadPoolExecutor(8, thread_name_prefix="grpo-vllm-requests")

    # -- HTTP ----------------------------------------------------------------------------
    def call(self, method: str, path: str, body: Any = None, *, timeout: float | None = None,
             answer: Any = None, text: bool = False) -> Any:
        """The answer as JSON, as the ``answer`` model (grpocli.wire.vllm_api), or as ``text`` (vLLM's LoRA routes
        answer plain text); failures as UserError."""
        timeout = self.timeout if timeout is None else timeout
        try:
            if text:
                return self.http.send(method, path, body, timeout=timeout).content.decode(errors="replace")
            return self.http.call(method, path, body, answer=answer, timeout=timeout)
        except Refused as exc:
            raise self._refused(exc) from None
        except Unavailable as exc:
            if exc.timed_out:
                raise ServerUnavailable(
                    f"the {self.kind} at {self.url} did not answer {method} {path} within {timeout:g} s",
                    where="vllm.server_timeout", valid="a longer timeout, or a server that is not stuck",
                    hint="raise vllm.server_timeout, and look at the server's terminal for errors",
                ) from None
            raise ServerUnavailable(  # refused, reset, cut short
                f"no {self.kind} answers at {self.url} ({exc.reason})", where="vllm.server_url",
                valid="the URL of a running vLLM server (grpo vllm-serve)", hint=START_HINT,
            ) from None
        except BadAnswer as exc:
            raise self._bad(method, path, exc) from None

    def _refused(self, exc: Refused) -> UserError:
        hint = {401: f"export {api.KEY_ENV}=<the server's --api-key> before grpo train",
                503: "an update that failed midway leaves the weights incomplete (/health says so); the next "
                     "complete one repairs them"}.get(
            exc.status, "look at the server's terminal for the full error")
        error = ServerUnavailable if exc.status >= 500 else UserError  # 5xx: its engine is stuck, dead or failing
        return error(f"the {self.kind} at {self.url} refused {exc.path}: HTTP {exc.status}: {exc.detail}",
                     where="vllm.server_url", hint=hint)

    def _bad(self, method: str, path: str, exc: BadAnswer) -> UserError:
        return UserError(f"the {self.kind} at {self.url} answered {method} {path} outside its protocol: {exc.what}",
                         where=f"{exc.field} of the answer",
                         valid=f"an answer of vLLM {'.'.join(map(str, api.RL_API_SINCE))} or later",
                         hint="look at the server's vLLM version (GET /version)")

    def wait_for_health(self, timeout: float | None = None) -> None:
        """Poll /health until the server answers (it may still be starting). A server whose weights an
        update left incomplete (503 "weights_incomplete", grpocli.server.guard) is up: the first update repairs it."""
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.call("GET", api.HEALTH_PATH, timeout=min(5.0, timeout))
                return
            except UserError as err:
                if api.INCOMPLETE in err.what:
                    return
                if time.monotonic() + 1.0 > deadline:
                    raise UserError(f"{err.what}; waited {timeout:g} s", where=err.where, valid=err.valid,
                                    hint=err.hint) from None
                time.sleep(1.0)

    # -- start ----------------------------------------------------------------------------
    def wait_until_ready(self, timeout: float | None = None) -> dict[str, Any]:
        """/health, then what the server must have to train against: every missing part named."""
        self.wait_for_health(timeout)
        version = str(self.call("GET", api.VERSION_PATH).get("version", "0"))
        if _release(version) < api.RL_API_SINCE:
            raise UserError(f"the vLLM server at {self.url} runs vLLM {version}, which has no RL API (pause, resume, "
                            "weight-transfer engines)", where="vllm.server_url",
                            valid=f"vLLM {'.'.join(map(str, api.RL_API_SINCE))} or later",
                            hint="pip install -U vllm on the server, or run grpo vllm-serve there")
        try:
            info = self.call("GET", api.SERVER_INFO_PATH, answer=api.ServerInfo).vllm_config
        except UserError as err:
            if "HTTP 404" not in err.what:
                raise
            raise UserError(f"the vLLM server at {self.url} does not expose its RL API (weight updates, pause)",
                            where="vllm.server_url", valid="a server started with VLLM_SERVER_DEV_MODE=1",
                            hint=RESTART) from None
        backend = (info.weight_transfer_config or {}).get("backend")
        m = info.model_config_
        lacks = []
        if backend not in TRANSPORTS:
            has = "no weight-transfer engine" if backend is None else f"the weight-transfer engine {backend!r}"
            lacks.append((f"{has} (grpo sends weights through {' or '.join(TRANSPORTS)})",
                          "--weight-transfer-config '{\"backend\": \"grpo_gloo\"}' (any machine; \"nccl\" on GPUs)"))
        if m.logprobs_mode != api.PROCESSED:
            lacks.append((f"{m.logprobs_mode} (the importance-sampling correction needs the log-probs tokens were "
                          "sampled with, after temperature and top-k/top-p, else it is biased)",
                          "--logprobs-mode processed_logprobs"))
        if lacks:
            raise UserError(f"the vLLM server at {self.url} has " + "; and ".join(what for what, _ in lacks),
                            where="vllm.server_url", valid=" ".join(flag for _, flag in lacks), hint=RESTART)
        self.model = self.base_model = str(m.served_model_name or m.model)
        world = int(self.call("GET", api.WORLD_SIZE_PATH).get("world_size", 1))
        lora = info.lora_config or {}
        return {"model": self.model, "max_model_len": m.max_model_len, "world_size": world,
                "dtype": m.dtype.removeprefix("torch."), "transports": [TRANSPORTS[backend]], "vllm": version,
                "lora_rank": int(lora.get("max_lora_rank") or 0)}

    # -- generation ---------------------------------------------------------------------
    def generate(self, prompt_ids: list[list[int]], n: int, sampling: Sampling, *,
                 seed: int | list[int] | None = None) -> Generated:
        """n completions per prompt, one request per prompt (each with its own seed), all at once. Greedy
        (temperature 0) asks for one, which is all n (vLLM refuses n > 1 with greedy sampling)."""
        seeds = seed if isinstance(seed, list) else [seed] * len(prompt_ids)
        greedy = sampling.temperature == 0
        asked = [api.CompletionRequest(
            model=self.model, prompt=ids, n=1 if greedy else n, max_tokens=sampling.max_tokens, temperature=sampling.temperature,
            top_p=sampling.top_p, top_k=sampling.top_k or -1, min_p=sampling.min_p,
            repetition_penalty=sampling.repetition_penalty, stop=list(sampling.stop), seed=s)
            for ids, s in zip(prompt_ids, seeds)]
        answers = list(self.pool.map(
            lambda body: self.call("POST", api.COMPLETIONS_PATH, body, answer=api.CompletionAnswer), asked))
        completions, truncated, logprobs = [], [], []
        for answer in answers:
            for choice in sorted(answer.choices, key=lambda c: c.index) * (n if greedy else 1):
                completions.append(list(choice.token_ids))
                truncated.append(choice.finish_reason == "length")
                got = choice.logprobs.token_logprobs if choice.logprobs else []
                logprobs.append([float("nan") if x is None else x for x in got])
        return Generated(prompt_ids=[list(p) for p in prompt_ids], completion_ids=completions, truncated=truncated,
                         logprobs=logprobs)

    def generate_group(self, group: GroupRequest, sampling: Sampling, *, default_version: int) -> FinishedGroup:
        """One group's n samples on the token-in/token-out route, each token with the weight version that
        sampled it (generation.pipeline = "inflight"; the server needs --enable-scale-out)."""
        params = {"n": group.n, "max_tokens": sampling.max_tokens, "temperature": sampling.temperature,
                  "top_p": sampling.top_p, "top_k": sampling.top_k or -1, "min_p": sampling.min_p,
                  "repetition_penalty": sampling.repetition_penalty, "stop": list(sampling.stop), "logprobs": 0,
                  "seed": group.seed}
        body = api.TokensRequest(token_ids=group.prompt_ids, sampling_params=params, model=self.model)
        try:
            answer = self.call("POST", api.TOKENS_PATH, body, answer=api.TokensAnswer, timeout=None)
        except UserError as err:
            if "HTTP 403" in err.what or "HTTP 404" in err.what:
                raise UserError(f"the vLLM server at {self.url} does not serve {api.TOKENS_PATH}, which in-flight "
                                "generation reads each token's weight version from", where="generation.pipeline",
                                valid="a server started with --enable-scale-out, or generation.pipeline = \"sync\"",
                                hint=f"{RESTART} --enable-scale-out") from None
            raise
        choices = sorted(answer.choices, key=lambda c: c.index)
        ids = [c.token_ids or [] for c in choices]
        return FinishedGroup(
            serial=group.serial, prompt_ids=list(group.prompt_ids), completion_ids=ids,
            truncated=[c.finish_reason == "length" for c in choices],
            logprobs=[[e.logprob for e in (c.logprobs.content or [])] if c.logprobs else [float("nan")] * len(t)
                      for c, t in zip(choices, ids)],
            versions=[token_versions(c.weight_versions, len(t), default_version) for c, t in zip(choices, ids)])

    def label_weights(self, version: int) -> None:
        """What the server calls the weights it holds from now on (each token's version reports it)."""
        self.call("POST", api.VERSION_LABEL_PATH, {"new_version": str(version)})

    def abort_all(self) -> None:
        with contextlib.suppress(UserError):
            self.call("POST", api.ABORT_PATH, {}, timeout=min(self.timeout, 10.0))

    def pause(self, mode: str = "keep") -> None:
        """vLLM's /pause: "keep" freezes the requests in flight (their KV cache too) until /resume."""
        self.call("POST", f"{api.PAUSE_PATH}?mode={mode}")

    def resume(self) -> None:
        self.call("POST", api.RESUME_PATH)

    # -- weights -------------------------------------------------------------------------
    def use_adapter(self, name: str, path: str) -> None:
        """vLLM's /v1/load_lora_adapter of ``path`` (a directory the server reads) as ``name``, which later
        requests name; the adapter before it is unloaded."""
        self.call("POST", api.LOAD_LORA_PATH, {"lora_name": name, "lora_path": path}, text=True)
        previous, self.model = self.model, name
        if previous != self.base_model:
            with contextlib.suppress(UserError):
                self.call("POST", api.UNLOAD_LORA_PATH, {"lora_name": previous}, text=True)

    def begin_update(self, transport: str) -> str:
        """Join the server's workers in a group (first time), then vLLM's /start_weight_update."""
        if self.group is None:
            self.open_group(transport)
        try:
            self.call("POST", api.START_UPDATE_PATH)
        except ServerUnavailable as err:  # an update left open (a trainer killed mid-sync): close it, start anew
            if "already" not in err.what:
                raise
            self.call("POST", api.FINISH_UPDATE_PATH, {"weight_version": None})
            self.call("POST", api.START_UPDATE_PATH)
        self.versions += 1
        return str(self.versions)

    def open_group(self, backend: str) -> None:
        """Host the group's store as rank 0 while the server's workers join it (ranks 1..world)."""
        import torch.distributed as dist

        from grpocli.generation.weights import open_group

        world = 1 + int(self.call("GET", api.WORLD_SIZE_PATH).get("world_size", 1))
        server = urllib.parse.urlparse(self.url).hostname or "127.0.0.1"
        address = _address_towards(server)
        store = dist.TCPStore(address, 0, world, True, timedelta(seconds=self.timeout), wait_for_workers=False)
        init = {"master_address": address, "master_port": store.port, "world_size": world, "rank_offset": 1,
                "timeout": self.timeout}
        with ThreadPoolExecutor(1) as pool:
            joined = pool.submit(self.call, "POST", api.INIT_TRANSFER_PATH, {"init_info": init})
            try:
                self.group = open_group(backend, store, 0, world, self.timeout,
                                        hostname="127.0.0.1" if address == "127.0.0.1" else None)
            except Exception as exc:
                raise UserError(f"the vLLM server at {self.url} did not join the weight group at {address}:"
                                f"{store.port}: {exc}", where="vllm.server_url",
                                hint="the server must reach the trainer on that address") from None
            joined.result()
        self.store = store

    def send_bucket(self, uid: str, payload: Any) -> None:
        """One flat bucket: announced by vLLM's /update_weights while it is broadcast."""
        flat, specs = payload
        info = {"names": [s.name for s in specs], "dtype_names": [s.dtype for s in specs],
                "shapes": [list(s.shape) for s in specs]}
        self.announced_broadcast(flat, "POST", api.UPDATE_PATH, {"update_info": info})

    def end_update(self, uid: str) -> dict[str, Any]:
        """vLLM's /finish_weight_update (labelled ``self.label`` when in flight, else the update's number), then
        its prefix cache reset: cached prefixes hold the old weights' keys. Paused with requests kept, only
        what they do not hold is reset, unless ``self.recompute`` (generation.inflight_kv_cache)."""
        version = uid if self.label is None else str(self.label)
        self.call("POST", api.FINISH_UPDATE_PATH, {"weight_version": version})
        self.call("POST", api.RESET_PATH + ("?reset_running_requests=true" if self.recompute else ""))
        return {"weights_version": version}

    def abort_update(self, uid: str) -> None:
        """Close the update (best effort): its layers keep what arrived; the next complete update repairs it."""
        with contextlib.suppress(UserError):
            self.call("POST", api.FINISH_UPDATE_PATH, {"weight_version": None}, timeout=min(self.timeout, 10.0))

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


    def announced_broadcast(self, flat: Any, method: str, path: str, body: Any) -> None:
        """Call ``method path body`` (the announcement the server receives the bucket by) while broadcasting
        ``flat`` from rank 0 of the group; whichever fails first is reported, and the group is then dropped
        (out of step: rebuilt next time)."""
        with ThreadPoolExecutor(1) as pool:
            announced = pool.submit(self.call, method, path, body)
            work = self.group.broadcast(flat, 0, timedelta(seconds=self.timeout))
            deadline = time.monotonic() + self.timeout
            while not work.is_completed():
                if announced.done() and announced.exception() is not None:
                    self.group = None
                    raise announced.exception()
                if time.monotonic() > deadline:
                    self.group = None
                    raise ServerUnavailable(
                        f"the weight broadcast to {self.url} did not finish within {self.timeout:g} s",
                        where="vllm.server_timeout", hint=self.stalled_hint)
                time.sleep(0.002)
            try:
                work.wait()
            except RuntimeError as exc:  # the peer went away: gloo/NCCL's DistBackendError
                self.group = None
                raise ServerUnavailable(f"the weight broadcast to {self.url} failed: {exc}",
                                        where="vllm.server_url", hint="look at the server's terminal") from None
            announced.result()



def _release(version: str) -> tuple[int, int]:
    """'0.32.0' -> (0, 32); anything unreadable -> (0, 0)."""
    parts = version.split(".")
    try:
        return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)
    except (IndexError, ValueError):
        return 0, 0


def _address_towards(host: str) -> str:
    """This machine's address on the route to ``host`` (127.0.0.1 for a server on this machine)."""
    if host in LOCAL_HOSTS:
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((socket.gethostbyname(host), 9))
        return sock.getsockname()[0]


__all__ = ["LOCAL_HOSTS", "RESTART", "START_HINT", "TRANSPORTS", "ServerClient", "ServerUnavailable"]
