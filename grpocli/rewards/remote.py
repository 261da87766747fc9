"""[[rewards]] entries with ``url``: a reward scored by `grpo reward-serve` server(s) over HTTP.

``RemoteReward`` stands in for the function: grpo calls it with the keywords it passes any reward
(grpocli.rewards.scoring), and it sends them as JSON to ``POST /score``: the prompts, the
completions (strings or message lists, as TRL hands them), ``completion_ids``, each dataset column
and the ``trainer_state``'s fields; the server calls the reward on the batch with the same keywords
and sends back one score (or None) per completion plus what the reward logged through
``log_extra`` / ``log_metric``, which reach this run's own log as they would in-process.

Several URLs split each batch into contiguous parts, one per server that answered last time,
sent concurrently. A part whose server fails (connection refused or reset, no answer within
``timeout``, a 5xx that is not the reward's own error) is sent to the next server after
``retry_backoff`` seconds (doubled for each further retry), up to ``retries`` times; a server that
failed is passed over for ``DOWN_S`` seconds while others answer. When every try fails the call
raises ``ServerFailure`` and the entry's ``on_error`` decides, as for a reward that raised; so
does the reward raising on the server (``RemoteRewardError``). What no retry can fix is a
UserError at once, naming the server: a wrong API key (401), args the server did not fix (403: a
reward server's operator fixes its args, grpocli.reward_server.fixed; the entry's args may only
repeat them), a reward the server does not serve (404), a request it refuses (413, 422), an
answer that breaks the protocol (not JSON, a missing field, the wrong number of scores, a score
that is no number), and a reward that returns no valid scores.

The API key is read from an environment variable (``api_key_env``, default ``KEY_ENV``), never
from the recipe. The protocol (ScoreRequest, ScoreAnswer) is grpocli/wire/rewards.py's, spoken
through grpocli.wire.client, whose timeout bounds the whole answer: a server that trickles bytes is
a server that did not answer in time. No server-side import here (the server is
grpocli.reward_server, above this layer).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpocli.errors import UserError
from grpocli.wire.client import JSON, BadAnswer, Client, Refused, Unavailable
from grpocli.wire.rewards import (
    ANSWER_SHAPE,
    KEY_ENV,
    PROTOCOL_VERSION,
    SCORE_PATH,
    ScoreAnswer,
    ScoreRequest,
    json_default,
)

if TYPE_CHECKING:
    from grpocli.recipe.schema import RewardSpec

DEFAULT_RETRIES = 2
DEFAULT_BACKOFF_S = 1.0
DOWN_S = 30.0  # a server that failed is passed over this long while another answers
REMOTE_ONLY = ("api_key_env", "retries", "retry_backoff")
START_HINT = "start one: grpo reward-serve REWARD --port 8100, and check [[rewards]] url"


class ServerFailure(RuntimeError):
    """Every try of a part of the batch failed on its server; ``tries``: (url, what happened)."""

    whole_batch = True  # grpocli.rewards.failures: no row to look for, on_error decides

    def __init__(self, reward: str, tries: list[tuple[str, str]]) -> None:
        self.tries = tries
        said = "; ".join(f"{url}: {what}" for url, what in tries)
        super().__init__(f"could not be scored by its reward server(s) after {len(tries)} tries ({said})")
        self.hint = (f"check that `grpo reward-serve {reward}` runs at each url and answers GET /health; "
                     "raise rewards[].timeout if it is only slow, or rewards[].retries")


class RemoteRewardError(RuntimeError):
    """The reward raised (or timed out) on its server; the server's words in the message."""

    whole_batch = True
    rows_alone = True  # on_error = "mask": its rows scored alone (one request each) find those it fails on

    def __init__(self, url: str, detail: str) -> None:
        super().__init__(f"failed on its server {url}: {detail}")
        self.hint = "fix the reward function (the server's log has its traceback)"


class _Down(Exception):
    """A server that did not answer usefully this time: another may."""


def urls_of(spec: RewardSpec, index: int) -> list[str]:
    """The entry's url(s), checked: http(s)://host[:port], no duplicates."""
    raw = spec.url
    urls = [raw] if isinstance(raw, str) else list(raw or [])
    where = f"rewards[{index}].url"
    if not urls:
        raise UserError("url is an empty list", where=where, valid="a URL or a list of URLs of grpo reward-serve",
                        hint=START_HINT)
    for url in urls:
        if not url.startswith(("http://", "https://")) or len(url.split("://", 1)[1].strip("/")) == 0:
            raise UserError(f"{url!r} is not an http(s) URL", where=where,
                            valid="http://HOST:PORT of a grpo reward-serve, e.g. http://127.0.0.1:8100",
                            hint=START_HINT)
    if len(set(urls)) != len(urls):
        raise UserError(f"url lists a server twice: {urls}", where=where, valid="distinct URLs")
    return [u.rstrip("/") for u in urls]


def check_remote_only(spec: RewardSpec, index: int) -> None:
    """UserError for api_key_env, retries or retry_backoff on an entry without url."""
    for key in REMOTE_ONLY:
        if getattr(spec, key, None) is not None:
            raise UserError(f"{key} is set for reward {spec.name!r}, which has no url", where=f"rewards[{index}].{key}",
                            valid=f"{key} only on entries scored by reward servers (with url = ...)",
                            hint=f"add url = 'http://HOST:PORT' of a grpo reward-serve, or leave {key} out")


def remote_label(name: str) -> tuple[str, str]:
    """The label and qualified label of the reward a server serves as ``name`` (as in-process)."""
    if ":" in name:
        target, _, attr = name.rpartition(":")
        return attr, (f"{Path(target).name}:{attr}" if target.endswith(".py") or "/" in target else name)
    if "/" in name or name.startswith((".", "~")):
        return Path(name).name, ""
    return name, ""


def from_spec(spec: RewardSpec, index: int) -> RemoteReward:
    """The RemoteReward of entry ``index``; its API key read from the environment now."""
    env = spec.api_key_env or KEY_ENV
    key = os.environ.get(env)
    if spec.api_key_env and not key:
        raise UserError(f"api_key_env names {env}, which is not set", where=f"rewards[{index}].api_key_env",
                        valid="the name of an environment variable that holds the servers' API key",
                        hint=f"export {env}=KEY (the key the servers were started with)")
    timeout = float(spec.timeout or 0) or None
    retries = DEFAULT_RETRIES if spec.retries is None else spec.retries
    backoff = DEFAULT_BACKOFF_S if spec.retry_backoff is None else spec.retry_backoff
    return RemoteReward(spec.name, urls_of(spec, index), index=index, args=dict(spec.args), timeout=timeout,
                        retries=retries, backoff=backoff, api_key=key, key_env=env)


class RemoteReward:
    """A reward scored by `grpo reward-serve` server(s) (module docstring); called as grpo calls any reward."""

    bounds_own_time = True  # each request has its timeout: called in the calling thread (grpocli.rewards.invocation)

    def __init__(self, name: str, urls: list[str], *, index: int = 0, args: dict[str, Any] | None = None,
                 timeout: float | None = None, retries: int = DEFAULT_RETRIES, backoff: float = DEFAULT_BACKOFF_S,
                 api_key: str | None = None, key_env: str = KEY_ENV) -> None:
        self.name, self.urls, self.index, self.args = name, urls, index, dict(args or {})
        self.timeout, self.retries, self.backoff = timeout, retries, backoff
        self.api_key, self.key_env = api_key, key_env
        self.clients = {url: Client(url, timeout=timeout, api_key=api_key) for url in urls}
        self.__name__ = remote_label(name)[0]
        self._down: dict[str, float] = {}  # url -> monotonic time until which it is passed over
        self._lock = threading.Lock()

    takes_row_seconds = True  # forwards the server's row_seconds (grpocli.rewards.timings)

    def __repr__(self) -> str:
        return f"RemoteReward({self.name!r} at {', '.join(self.urls)})"

    def __call__(self, prompts: list, completions: list, **kwargs: Any) -> list[float | None]:
        log_extra, log_metric = kwargs.pop("log_extra", None), kwargs.pop("log_metric", None)
        log_row_seconds = kwargs.pop("log_row_seconds", None)  # what the server's reward reported (row_seconds)
        state, ids = kwargs.pop("trainer_state", None), kwargs.pop("completion_ids", None)
        for key in self.args:  # what the reward gets as args is sent once, not as columns
            kwargs.pop(key, None)
        n = len(completions)
        if n == 0:
            return []
        common = {"protocol": PROTOCOL_VERSION, "reward": self.name, "args": self.args,
                  "trainer_state": state_fields(state)}
        answers = self._score_parts(self._parts(n), common, prompts, completions, ids, kwargs)
        scores: list[float | None] = []
        row_seconds: list[float | None] = []  # an older server's answer has none: None for its rows
        for answer in answers:
            scores.extend(answer.scores)
            rows = answer.row_seconds
            fits = rows is not None and len(rows) == len(answer.scores)
            row_seconds.extend(rows if fits else [None] * len(answer.scores))
            for column, values in answer.log_extra.items():
                if log_extra is not None:
                    log_extra(column, values)
            for metric, values in answer.log_metric.items():
                for value in values if log_metric is not None else ():
                    log_metric(metric, value)
        if callable(log_row_seconds) and any(s is not None for s in row_seconds):
            log_row_seconds(row_seconds)
        return scores

    # -- splitting the batch -------------------------------------------------------------
    def _parts(self, n: int) -> list[tuple[int, int, str]]:
        """Contiguous (start, stop, url) parts, one per server not passed over (all when every one is)."""
        now = time.monotonic()
        with self._lock:
            live = [u for u in self.urls if self._down.get(u, 0.0) <= now] or list(self.urls)
        count = min(len(live), n)
        size, extra = divmod(n, count)
        parts, start = [], 0
        for k in range(count):
            stop = start + size + (1 if k < extra else 0)
            parts.append((start, stop, live[k]))
            start = stop
        return parts

    def _score_parts(self, parts, common, prompts, completions, ids, columns) -> list[ScoreAnswer]:
        bodies = [self._body(common, prompts, completions, ids, columns, start, stop) for start, stop, _ in parts]
        if len(parts) == 1:
            return [self._score_part(bodies[0], parts[0][1] - parts[0][0], parts[0][2])]
        with concurrent.futures.ThreadPoolExecutor(len(parts), thread_name_prefix="grpo-reward-http") as pool:
            futures = [pool.submit(self._score_part, body, stop - start, url)
                       for body, (start, stop, url) in zip(bodies, parts)]
            outcomes = []
            for future in futures:
                try:
                    outcomes.append(future.result())
                except Exception as exc:  # noqa: BLE001 - raised below, the clearest first
                    outcomes.append(exc)
        failed = [o for o in outcomes if isinstance(o, Exception)]
        for kind in (UserError, RemoteRewardError, Exception):
            for exc in failed:
                if isinstance(exc, kind):
                    raise exc
        return outcomes

    def _score_part(self, body: bytes, n: int, first: str) -> ScoreAnswer:
        """One part's answer, from ``first`` or, if it fails, the next servers in turn."""
        order = [first] + [u for u in self.urls if u != first]
        tries: list[tuple[str, str]] = []
        for attempt in range(1 + self.retries):
            url = order[attempt % len(order)]
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))  # backoff before a retry
            try:
                answer = self._post(url, body, n)
            except _Down as exc:
                with self._lock:
                    newly = self._down.get(url, 0.0) <= time.monotonic()
                    self._down[url] = time.monotonic() + DOWN_S
                if newly:
                    others = "retried on the other servers, which score it" if len(self.urls) > 1 else "retried"
                    print(f"warning: reward server {url} failed for {self.name!r} ({exc}); its part of the batch is "
                          f"{others} for the next {DOWN_S:g} s", file=sys.stderr, flush=True)
                tries.append((url, str(exc)))
                continue
            with self._lock:
                self._down.pop(url, None)
            return answer
        raise ServerFailure(self.name, tries)

    # -- one request ---------------------------------------------------------------------
    def _body(self, common, prompts, completions, ids, columns, start, stop) -> bytes:
        part = ScoreRequest.model_construct(  # unchecked: the server checks it
            **common, prompts=prompts[start:stop], completions=completions[start:stop],
            completion_ids=None if ids is None else ids[start:stop],
            columns={k: v[start:stop] for k, v in columns.items()})
        try:
            return part.to_json()
        except (TypeError, ValueError):
            pass
        for key in ("prompts", "completions", "completion_ids", *(f"columns.{k}" for k in columns)):
            value = part.columns[key[8:]] if key.startswith("columns.") else getattr(part, key)
            try:
                json.dumps(value, default=json_default)
            except (TypeError, ValueError) as exc:
                raise UserError(f"{key} cannot be sent to a reward server as JSON: {exc}",
                                where=f"rewards[{self.index}].url",
                                valid="strings, numbers, lists and dicts (JSON) in what the reward gets",
                                hint="score this reward in-process (leave url out), or drop the column") from None
        raise UserError("the trainer_state cannot be sent as JSON", where=f"rewards[{self.index}].url")

    def _post(self, url: str, body: bytes, n: int) -> ScoreAnswer:
        try:
            raw = self.clients[url].send("POST", SCORE_PATH, body, content_type=JSON).content
        except Refused as exc:
            raise self._refused(url, exc) from None
        except Unavailable as exc:  # refused, reset, cut short, or "no answer within {timeout} s"
            raise _Down(exc.reason) from None
        try:
            return ScoreAnswer.read(raw, n)
        except BadAnswer as exc:
            raise UserError(f"reward server {url} answered {exc.what}", where=f"{exc.field} of the answer of {url}",
                            valid=ANSWER_SHAPE,
                            hint=f"is {url} a grpo reward-serve of this version? {START_HINT}") from None

    def _refused(self, url: str, exc: Refused) -> Exception:
        """The exception for an HTTP error status: a UserError, the reward's error, or _Down."""
        detail, where = exc.detail, f"rewards[{self.index}] (server {url})"
        if exc.status == 401:
            return UserError(f"reward server {url} refused the API key (HTTP {exc.status}): {detail}",
                             where=f"rewards[{self.index}].api_key_env", valid="the key the server was started with",
                             hint=f"export {self.key_env}=KEY, the key given to grpo reward-serve --api-key")
        if exc.status == 403:  # args the server did not fix: its operator chooses them, not this recipe
            return UserError(f"reward server {url} refused the args of {self.name!r} (HTTP 403): {detail}",
                             where=f"rewards[{self.index}].args",
                             valid="args that repeat those the server was started with (GET /info lists them), "
                                   "or none",
                             hint="leave args out of this [[rewards]] entry (the server applies its own), or ask its "
                                  f"operator to start it with --args '{self.name}={{...}}'")
        if exc.status == 404:
            return UserError(f"reward server {url} does not serve {self.name!r}: {detail}",
                             where=f"rewards[{self.index}].name", valid="a reward the server serves (GET /info)",
                             hint=f"start it with the reward: grpo reward-serve {self.name} ...")
        if exc.status in (400, 413, 422):
            return UserError(f"reward server {url} refused the request (HTTP {exc.status}): {detail}", where=where,
                             valid=f"a request of protocol {PROTOCOL_VERSION} (grpo train and grpo reward-serve of "
                                   "one version)")
        failure = exc.answer.get("failure") if isinstance(exc.answer, dict) else None
        if exc.status == 500 and failure == "raised":
            return RemoteRewardError(url, detail)
        if exc.status == 500 and failure == "invalid":
            return UserError(f"on server {url}: {detail}", where=where, hint="fix the reward function's return value")
        return _Down(f"HTTP {exc.status}: {detail}")


def state_fields(state: Any) -> dict[str, Any] | None:
    """The trainer_state's fields that JSON carries (a ``transformers.TrainerState`` is a dataclass)."""
    if state is None:
        return None
    fields = ({f.name: getattr(state, f.name) for f in dataclasses.fields(state)} if dataclasses.is_dataclass(state)
              else dict(vars(state)))
    out = {}
    for key, value in fields.items():
        try:
            json.dumps(value, default=json_default)
        except (TypeError, ValueError):
            continue
        out[key] = value
    return out


__all__ = ["RemoteReward", "RemoteRewardError", "ServerFailure", "check_remote_only", "from_spec", "remote_label",
           "state_fields", "urls_of"]
