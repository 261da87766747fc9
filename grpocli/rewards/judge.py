"""``judge``: an LLM grades each completion through an OpenAI-compatible chat endpoint.

LLM-as-a-judge (Zheng et al. 2023, "Judging LLM-as-a-Judge with MT-Bench and Chatbot Arena";
RLAIF, Lee et al. 2023): the recipe's rubric template, filled with the prompt, the completion and
any dataset column, is sent as one chat request per completion to ``base_url`` (``grpo
vllm-serve``, vLLM's ``vllm serve``, or any provider the ``openai`` client speaks to); the
reply is read as a score (``grpocli.rewards.verdicts``: the whole reply when it is the verdict,
else the judge's own last verdict line, never a verdict the completion holds and the judge
quotes) and mapped onto [0, 1]. A reply that
cannot be read scores None, and is counted (``log_metric``: ``<metric_prefix>/unparsed``).

Identical requests (base_url, model, messages, sampling params) are sent once per process: a
thread-safe LRU of replies (``ReplyCache``), which also makes the identical completions a
GRPO group often holds cost one request. Requests run ``concurrency`` at a time in threads.

Rubric placeholders are ``{name}`` with ``name`` one of ``prompt``, ``completion``,
``score_min``, ``score_max`` or a dataset column; every other brace is text (a JSON example
such as ``{"score": 7}`` needs no escaping). Unknown placeholders are refused before a model
loads (``check_args``, run by ``grpocli.rewards.arguments.check_reward_signature``).
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any
from urllib.parse import urlparse

from pydantic import Field, ValidationError, model_validator

from grpocli.errors import UserError
from grpocli.recipe.section import Section
from grpocli.registry.contracts import recipe_args
from grpocli.registry.hookspecs import REWARD_KEYWORDS
from grpocli.rewards.text import completion_text
from grpocli.rewards.timings import RowClock
from grpocli.rewards.verdicts import MAX_PARSED_CHARS, normalized, parse_score

DEFAULT_RUBRIC = (
    "You are grading a response to a task.\n\nTask:\n{prompt}\n\nResponse:\n{completion}\n\n"
    "Rate how well the response accomplishes the task, from {score_min} (useless) to {score_max} "
    "(perfect). Explain briefly, then end with a line of the form \"Score: N\"."
)
PLACEHOLDER = re.compile(r"\{([A-Za-z_]\w*)\}")
ALWAYS = ("prompt", "completion", "score_min", "score_max")
LOOPBACK = ("127.0.0.1", "localhost", "::1", "0.0.0.0")
INSTALL = "pip install 'grpocli[judge]' (the openai client)"


class JudgeArgs(Section):
    """The ``[[rewards]] args`` of ``judge``."""

    model: str = Field(min_length=1, description="The judge model's name as the endpoint serves it "
                       "(`GET {base_url}/models` lists them; for grpo vllm-serve, its --model).")
    base_url: str | None = Field(None, description="The OpenAI-compatible API, e.g. http://127.0.0.1:8000/v1 "
                                 "(default: $OPENAI_BASE_URL, else OpenAI's API).")
    api_key_env: str = Field("OPENAI_API_KEY", min_length=1, description="The environment variable holding the "
                             "API key; a local endpoint (127.0.0.1, localhost) without one gets a placeholder key.")
    rubric: str = Field(DEFAULT_RUBRIC, min_length=1, description="The user message: {prompt}, {completion}, "
                        "{score_min}, {score_max} and {<dataset column>} are filled in; other braces are text.")
    system: str | None = Field(None, description="A system message sent before the rubric.")
    score_min: float = Field(0.0, description="The lowest score the rubric asks for.")
    score_max: float = Field(10.0, description="The highest score the rubric asks for.")
    normalize: bool = Field(True, description="Map scores from [score_min, score_max] onto [0, 1].")
    strict: bool = Field(False, description="Read only explicit forms (Score: N, N/10, JSON, \\boxed{N}), "
                         "never a bare number in the reply.")
    temperature: float = Field(0.0, ge=0.0, le=2.0, description="The judge's sampling temperature.")
    max_tokens: int = Field(256, ge=1, le=32768, description="Longest judge reply, in tokens.")
    concurrency: int = Field(8, ge=1, le=256, description="Requests in flight at once.")
    timeout: float = Field(60.0, gt=0.0, le=3600.0, description="Seconds one request may take (per try).")
    max_retries: int = Field(2, ge=0, le=10, description="Retries of a request that failed to connect, timed "
                             "out or got a 429/5xx (the openai client's, with backoff).")
    cache_size: int = Field(65536, ge=0, description="Replies kept for identical requests (0: no cache).")
    extra_body: dict[str, Any] = Field(default_factory=dict, description="More request fields, e.g. vLLM's "
                                       "structured_outputs = {regex = 'Score: (10|[0-9])'} or a provider's own.")
    metric_prefix: str = Field("judge", min_length=1, description="Prefix of the metrics and rollout column "
                               "this reward logs (give two judges of a recipe different ones).")

    @model_validator(mode="after")
    def _range(self) -> JudgeArgs:
        if not self.score_min < self.score_max:
            raise ValueError(f"score_min ({self.score_min:g}) must be below score_max ({self.score_max:g})")
        return self


FIELDS = tuple(JudgeArgs.model_fields)


class ReplyCache:
    """A thread-safe LRU of replies by request key; a request already in flight is waited for, not sent again."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[str, Future] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str, ask: Callable[[], str | None]) -> tuple[str | None, bool]:
        """(reply, whether it came from the cache): ``ask()`` runs only for a key not seen before."""
        if self.size == 0:
            return ask(), False
        with self._lock:
            future = self._items.get(key)
            hit = future is not None
            if hit:
                self._items.move_to_end(key)
            else:
                future = self._items[key] = Future()
                while len(self._items) > self.size:
                    self._items.popitem(last=False)
        if hit:
            return future.result(), True
        try:
            future.set_result(ask())
        except BaseException as exc:
            with self._lock:
                if self._items.get(key) is future:
                    del self._items[key]  # a failed request is asked again next time
            future.set_exception(exc)
            raise
        return future.result(), False


class JudgeUnavailable(Exception):
    """The endpoint did not answer (connection, timeout, 429/5xx after retries): the reward's
    ``on_error`` decides (stop the run, or score the batch None)."""


class Judge:
    """One endpoint and model with its client and reply cache (one per distinct args, per process)."""

    def __init__(self, args: JudgeArgs) -> None:
        try:
            import openai
        except ImportError:
            raise UserError("the judge reward needs the openai package, which is not installed",
                            where="rewards (judge)", hint=INSTALL) from None
        self.args = args
        self.cache = ReplyCache(args.cache_size)
        self.client = openai.OpenAI(base_url=args.base_url, api_key=api_key(args), timeout=args.timeout,
                                    max_retries=args.max_retries)
        self.url = str(self.client.base_url)

    def ask(self, messages: list[dict[str, str]]) -> tuple[str | None, bool]:
        """The judge's reply to ``messages`` and whether it was cached."""
        a = self.args
        params = {"temperature": a.temperature, "max_tokens": a.max_tokens, **a.extra_body}
        key = json.dumps([self.url, a.model, messages, params], sort_keys=True, default=str)
        return self.cache.get(key, lambda: self._request(messages))

    def _request(self, messages: list[dict[str, str]]) -> str | None:
        import openai

        a = self.args
        try:
            reply = self.client.chat.completions.create(model=a.model, messages=messages, temperature=a.temperature,
                                                        max_tokens=a.max_tokens, extra_body=a.extra_body or None)
        except (openai.APIConnectionError, openai.RateLimitError, openai.InternalServerError) as exc:
            raise JudgeUnavailable(f"the judge at {self.url} did not answer after {a.max_retries} retries "
                                   f"({type(exc).__name__}: {exc}); start it (e.g. grpo vllm-serve --model DIR "
                                   "--port N), or fix args.base_url") from None
        except openai.APIStatusError as exc:  # 4xx: the request itself is wrong (model name, key, fields)
            raise UserError(f"the judge at {self.url} refused the request ({exc.status_code}): {_detail(exc)}",
                            where="rewards (judge).args",
                            valid="a model the endpoint serves, its API key, request fields it takes",
                            hint=f"check args.model (GET {self.url.rstrip('/')}/models), args.api_key_env "
                            f"(${a.api_key_env}) and args.extra_body") from None
        choices = reply.choices or []
        return choices[0].message.content if choices else None


_judges: dict[str, Judge] = {}
_judges_lock = threading.Lock()


def judge_for(args: JudgeArgs) -> Judge:
    """The process's Judge for these args (its cache lives as long as the process: one run)."""
    key = args.model_dump_json()
    with _judges_lock:
        if key not in _judges:
            _judges[key] = Judge(args)
        return _judges[key]


def api_key(args: JudgeArgs, where: str = "rewards (judge).args") -> str:
    """The key from ``args.api_key_env``; a placeholder for a local endpoint; UserError otherwise."""
    key = os.environ.get(args.api_key_env)
    if key:
        return key
    base = args.base_url or os.environ.get("OPENAI_BASE_URL") or ""
    if urlparse(base).hostname in LOOPBACK:
        return "EMPTY"  # vLLM's convention: a local server started without --api-key takes any key
    raise UserError(f"the judge's API key variable ${args.api_key_env} is not set",
                    where=f"{where}.api_key_env",
                    valid="the name of an environment variable that holds the endpoint's key",
                    hint=f"export {args.api_key_env}=... before grpo train, or set args.api_key_env")


def placeholders(rubric: str) -> list[str]:
    """The ``{name}`` placeholders of a rubric, in order, each once."""
    return list(dict.fromkeys(PLACEHOLDER.findall(rubric)))


def render(rubric: str, values: Mapping[str, str]) -> str:
    """``rubric`` with each ``{name}`` of ``values`` replaced; every other brace left as written."""
    return PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), rubric)


def prompt_text(prompt: Any) -> str:
    """A prompt as the judge reads it: the text, a lone user message's content, or 'role: content' lines."""
    if isinstance(prompt, str):
        return prompt
    messages = [m for m in prompt if isinstance(m, dict)] if isinstance(prompt, (list, tuple)) else []
    if len(messages) == 1:
        return completion_text(messages)
    return "\n\n".join(f"{m.get('role', 'user')}: {completion_text([m])}" for m in messages)


def parse_args(args: Mapping[str, Any], where: str) -> JudgeArgs:
    """JudgeArgs from a [[rewards]] args table; UserError naming the first bad key."""
    try:
        return JudgeArgs.model_validate(dict(args))
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err.get("loc", ()))
        raise UserError(f"{err.get('msg', 'invalid')}", where=f"{where}.{key}" if key else where,
                        valid=_valid(key), hint="`docs/judge.md` lists the judge's args") from None


def _valid(key: str) -> str:
    field = JudgeArgs.model_fields.get(key.split(".")[0])
    return field.description or key if field is not None else f"args among: {', '.join(FIELDS)}"


def check_args(args: Mapping[str, Any], columns: Collection[str], *, where: str) -> None:
    """Before any model loads: the args parse, the rubric names only known placeholders and holds
    {completion}, the API key is there, and openai is installed (``grpo train --dry-run`` runs it)."""
    parsed = parse_args(args, where)
    known = (*ALWAYS, *sorted(columns))
    unknown = [name for name in placeholders(parsed.rubric) if name not in known]
    if unknown:
        raise UserError(f"the rubric names {{{unknown[0]}}}, which is neither a dataset column nor a judge field",
                        where=f"{where}.rubric", valid=f"placeholders among: {', '.join(known)}",
                        hint="fix the placeholder's name, or write the text without braces")
    if "completion" not in placeholders(parsed.rubric):
        raise UserError("the rubric has no {completion}: the judge would not see what it grades",
                        where=f"{where}.rubric", valid="a rubric holding {completion}")
    api_key(parsed, where)
    try:
        import openai  # noqa: F401
    except ImportError:
        raise UserError("the judge reward needs the openai package, which is not installed", where=where,
                        hint=INSTALL) from None


def _detail(exc: Any) -> str:
    body = getattr(exc, "body", None)
    detail = body.get("detail") or body.get("message") if isinstance(body, dict) else None
    return str(detail or exc)[:500]


@recipe_args(*FIELDS)
def judge(prompts: list, completions: list, **kwargs: Any) -> list[float | None]:
    """An LLM judge grades each completion with the recipe's rubric via an OpenAI-compatible endpoint (docs/judge.md)."""
    n = len(completions)
    columns = {k: v for k, v in kwargs.items()
               if k not in REWARD_KEYWORDS and isinstance(v, list) and len(v) == n}
    args = parse_args({k: v for k, v in kwargs.items() if k in FIELDS and k not in columns}, "rewards (judge).args")
    check_args(args.model_dump(exclude_defaults=True), [c for c in columns if c not in FIELDS],
               where="rewards (judge).args")
    bench = judge_for(args)
    requests = [_messages(args, p, c, {k: v[i] for k, v in columns.items()}) for i, (p, c)
                in enumerate(zip(prompts, completions))]
    clock = RowClock(n, kwargs)  # each row's request, from its start (grpocli.rewards.timings)

    def ask(row: int, messages: list[dict[str, Any]]) -> tuple[str | None, bool]:
        with clock.row(row):
            return bench.ask(messages)

    with ThreadPoolExecutor(max_workers=min(args.concurrency, max(n, 1)), thread_name_prefix="grpo-judge") as pool:
        futures = [pool.submit(ask, row, messages) for row, messages in enumerate(requests)]
    answers = [f.result() for f in futures]  # the first failure raises, after every request ended
    clock.report()
    replies = [reply for reply, _ in answers]
    scores = [parse_score(r, args.score_min, args.score_max, strict=args.strict, completion=completion_text(c))
              for r, c in zip(replies, completions)]  # a verdict the completion holds is not the judge's
    _log(kwargs, args.metric_prefix, replies, scores, hits=sum(hit for _, hit in answers))
    if args.normalize:
        return [normalized(s, args.score_min, args.score_max) for s in scores]
    return scores


judge.check_args = check_args  # run with the recipe's args and the dataset's columns (arguments.py)
judge.takes_row_seconds = True  # reports each request's seconds (grpocli.rewards.timings)
#: Set by the operator of a reward server alone (grpo reward-serve --args), never by a request: where the
#: replies come from and which of the server's variables goes there as the key.
judge.operator_args = ("base_url", "api_key_env")


def _messages(args: JudgeArgs, prompt: Any, completion: Any, row: Mapping[str, Any]) -> list[dict[str, str]]:
    values = {k: str(v) for k, v in row.items() if k not in FIELDS}
    values.update(prompt=prompt_text(prompt), completion=completion_text(completion),
                  score_min=f"{args.score_min:g}", score_max=f"{args.score_max:g}")
    user = {"role": "user", "content": render(args.rubric, values)}
    return [{"role": "system", "content": args.system}, user] if args.system else [user]


def _log(kwargs: Mapping[str, Any], prefix: str, replies: list, scores: list, *, hits: int) -> None:
    """The batch's counts as TRL's log_metric, the replies as a log_extra column (when grpo passes them)."""
    log_metric, log_extra = kwargs.get("log_metric"), kwargs.get("log_extra")
    if callable(log_metric):
        log_metric(f"{prefix}/unparsed", float(sum(s is None for s in scores)))
        log_metric(f"{prefix}/requests", float(len(replies) - hits))
        log_metric(f"{prefix}/cache_hits", float(hits))
    if callable(log_extra):
        log_extra(f"{prefix}/reply", [logged_reply(r) for r in replies])


def logged_reply(reply: str | None) -> str | None:
    """A reply as the rollouts keep it: whole, or its last MAX_PARSED_CHARS (where the verdict is
    read) after a note, so that a judge answering megabytes does not fill the run directory."""
    if reply is None or len(reply) <= MAX_PARSED_CHARS:
        return reply
    return f"[grpo kept the last {MAX_PARSED_CHARS} of {len(reply)} characters] " + reply[-MAX_PARSED_CHARS:]


__all__ = ["DEFAULT_RUBRIC", "Judge", "JudgeArgs", "JudgeUnavailable", "ReplyCache", "check_args", "judge",
           "parse_args", "placeholders", "render"]
