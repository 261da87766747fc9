"""The turn loop: multi-turn rollouts for a whole batch, token-exact.

    turn 1      every prompt's G rollouts generate at once (backend.generate_ids, n = G)
    tools       the calls each model turn wrote (TOOL_CALL_PARSERS) run concurrently, each
                bounded by multi_turn.tool_timeout (grpocli.multiturn.execution)
    splice      the tool messages' tokens (the chat template's rendering of that turn alone,
                grpocli.multiturn.template.ToolTurns) are appended to the rollout's token ids
    reply       a turn without a call goes to the environment's ``respond(messages)`` where it
                has one (verl's interaction, verifiers' env_response): the text it returns is
                spliced in as a user turn the same way, and None ends the rollout; its methods
                are bounded by multi_turn.environment_timeout (grpocli.multiturn.environment_calls)
    turn k      every rollout still live generates at once from its prompt + completion so far

A rollout ends when the model answers without a call (a final answer) and no environment
replies to it (``respond`` absent or returning None), when its turn ends
without EOS or the completion budget (generation.max_completion_length: model and tool tokens
together) runs out (truncated), or after multi_turn.max_turns model turns. The completion is
the exact token ids the engine produced with the tool turns spliced in as tokens, and a mask
marks the model's own tokens (1) apart from the tool turns' (0): only the former enter the loss.

Where every generate call is a collective (the 'hf' backend under FSDP2: the parallel strategy's
`forward_collective`), the loop goes on while a rollout of any process is live (one all_reduce a
turn, `Parallel.any_process`), and a process without one makes empty calls (the backend's dummy
passes) until the others are done.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from grpocli.errors import UserError
from grpocli.generation.base import Generated, GenerationBackend, Sampling
from grpocli.multiturn.environment_calls import EnvironmentCalls
from grpocli.multiturn.execution import Outcome, run_turn
from grpocli.multiturn.parsers import TOOL_CALL_PARSERS, ToolCall
from grpocli.multiturn.template import ToolTurns, render_with_tools
from grpocli.multiturn.toolbox import Toolbox
from grpocli.parallel import Parallel

if TYPE_CHECKING:
    from grpocli.recipe.schema import Recipe


@dataclass
class TurnStats:
    """Counts over the rollouts of one or more batches (summed over processes for the metrics)."""

    rollouts: int = 0
    turns: int = 0                 # model turns
    calls: int = 0                 # tool calls run (errors included)
    errors: int = 0                # raised, timed out, unknown tool, unreadable call
    timeouts: int = 0
    final: int = 0                 # rollouts that ended with an answer without a tool call
    replies: int = 0               # user turns the environment's respond() spliced in
    by_tool: dict[str, int] = field(default_factory=dict)
    env: dict[str, float] = field(default_factory=dict)  # sums of the environments' get_metrics()

    def add(self, other: TurnStats) -> None:
        for key in ("rollouts", "turns", "calls", "errors", "timeouts", "final", "replies"):
            setattr(self, key, getattr(self, key) + getattr(other, key))
        for name, count in other.by_tool.items():
            self.by_tool[name] = self.by_tool.get(name, 0) + count
        for name, value in other.env.items():
            self.env[name] = self.env.get(name, 0.0) + value

    def metrics(self, reduce: Callable[[float], float] = float) -> dict[str, float]:
        """metrics.jsonl keys; `reduce` sums a count over processes. TRL's names where it has them
        (tools/call_frequency: calls per rollout, tools/failure_frequency: failed share of calls)."""
        n, calls = max(reduce(self.rollouts), 1.0), reduce(self.calls)
        errors = reduce(self.errors)
        out = {
            "multi_turn/turns_per_rollout": reduce(self.turns) / n,
            "multi_turn/final_answer_ratio": reduce(self.final) / n,
            "tools/call_frequency": calls / n,
            "tools/failure_frequency": errors / calls if calls else 0.0,
            "tools/errors": errors,
            "tools/timeouts": reduce(self.timeouts),
            "multi_turn/replies_per_rollout": reduce(self.replies) / n,
        }
        out.update({f"tools/calls_per_rollout/{name}": reduce(c) / n for name, c in sorted(self.by_tool.items())})
        out.update({f"env/{name}": reduce(v) / n for name, v in sorted(self.env.items())})  # mean per rollout
        return out


@dataclass
class Conversations:
    """A batch of multi-turn rollouts: `Generated` with the tool turns spliced in, and beside it."""

    generated: Generated                 # completion_ids [B*G][Tc]: model and tool tokens
    completion_mask: list[list[int]]     # [B*G][Tc] 1 on the model's tokens, 0 on tool turns
    messages: list[list[dict[str, Any]]]  # [B*G] the conversation after the prompt, turn by turn
    environments: list[Any] | None       # [B*G] one environment per rollout, or None
    stats: TurnStats


@dataclass
class _Rollout:
    """One rollout in the making."""

    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)  # this turn's calls, still to run
    reply: bool = False  # this turn had no call: the environment's respond() answers it
    done: bool = False
    truncated: bool = False


class TurnLoop:
    """Samples multi-turn rollouts with a backend that generates from token ids."""

    def __init__(self, toolbox: Toolbox, tokenizer: Any, recipe: Recipe, parallel: Parallel | None = None) -> None:
        self.toolbox, self.tokenizer = toolbox, tokenizer
        self.parallel = parallel or Parallel.alone()
        self.section, self.data = recipe.multi_turn, recipe.data
        self.max_prompt_length = recipe.data.max_prompt_length
        self.budget = recipe.generation.max_completion_length
        self.parse, self.strip = TOOL_CALL_PARSERS[self.section.tool_parser]
        self.tool_turns = ToolTurns(tokenizer)
        self.environment = EnvironmentCalls(str(toolbox.environment_source or "environment"),
                                            self.section.environment_timeout)
        self.prompt_messages: list[list[dict[str, Any]]] = []  # [B] the last batch's prompt messages

    def new_stats(self) -> TurnStats:
        """Empty counts with every tool named, so that each process logs the same keys."""
        return TurnStats(by_tool=dict.fromkeys(self.toolbox.tool_names, 0))

    def metrics(self, counts: list[TurnStats | None]) -> dict[str, float]:
        """tools/* and multi_turn/* over the rollouts of `counts` (a batch's fill rounds included),
        summed over every process (each names every tool, so that all log the same keys)."""
        summed = self.new_stats()
        for c in counts:
            if c is not None:
                summed.add(c)
        return summed.metrics(self.parallel.total)

    def sample(self, backend: GenerationBackend, rows: list[dict[str, Any]], n: int,
               sampling: Sampling) -> Conversations:
        """n multi-turn rollouts of each row, prompt-major, every live rollout generating at once."""
        envs = [self.environment.new(self.toolbox.new_environment) if self.toolbox.environment is not None else None
                for _ in range(len(rows) * n)]
        prompt_ids = self.prompts(rows, envs, n)
        state = [_Rollout() for _ in envs]
        stats = TurnStats(rollouts=len(state))
        live, contexts, count = list(range(len(state))), prompt_ids, n
        with_logprobs = False
        for turn in range(1, self.section.max_turns + 1):
            going = self.parallel.any_process(bool(live)) if backend.lockstep else bool(live)
            if turn > 1 and not going:
                break  # no live rollout (lockstep generate calls: on any process; one without takes part)
            room = max((self.budget - len(state[i].ids) for i in live), default=1)
            out = backend.generate_ids(contexts, count, replace(sampling, max_tokens=room))
            with_logprobs = out.logprobs is not None if live else with_logprobs
            for k, i in enumerate(live):
                lp = out.logprobs[k] if with_logprobs else None
                self.take_turn(state[i], out.completion_ids[k], lp, out.truncated[k], turn)
            stats.turns += len(live)
            pending = [i for i in live if state[i].calls]
            if pending:
                outcomes = run_turn([state[i].calls for i in pending],
                                    [self.toolbox.functions(envs[i]) for i in pending], self.section.tool_timeout)
                for i, done in zip(pending, outcomes, strict=True):
                    self.take_results(state[i], done, stats)
            answered = [i for i in live if state[i].reply]
            for i in answered:
                self.take_reply(state[i], envs[i], self.prompt_messages[i // n], stats,
                                last=turn == self.section.max_turns)
            live = [i for i in live if not state[i].done]  # calls run, or a reply given
            contexts, count = [prompt_ids[i // n] + state[i].ids for i in live], 1
        stats.final = sum(1 for r in state if r.messages and r.done and not r.truncated
                          and "tool_calls" not in r.messages[-1])
        stats.env = self.environment.metrics(envs)
        generated = Generated(prompt_ids=prompt_ids, completion_ids=[r.ids for r in state],
                              truncated=[r.truncated for r in state],
                              logprobs=[r.logprobs for r in state] if with_logprobs else None)
        return Conversations(generated, [r.mask for r in state], [r.messages for r in state],
                             envs if self.toolbox.environment is not None else None, stats)

    # -- prompts -------------------------------------------------------------------------
    def prompts(self, rows: list[dict[str, Any]], envs: list[Any], n: int) -> list[list[int]]:
        """Each row's prompt ids: its messages (plus what its environments' reset returned) in the
        chat template with the tools, left-truncated to data.max_prompt_length."""
        from grpocli.data.template import build_messages

        texts, self.prompt_messages = [], []
        for b, row in enumerate(rows):
            messages = build_messages(row, self.data)
            seen = {self.environment.reset(env, row) for env in envs[b * n : (b + 1) * n]}
            if len(seen) > 1:
                raise UserError(
                    "the environment's reset() returned different text for rollouts of one prompt: GRPO compares "
                    "the completions of one prompt, so they must start from the same one",
                    where="multi_turn.environment", valid="reset(**row) whose return value depends on the row only",
                    hint="draw the environment's randomness from a dataset column (e.g. a seed column)",
                )
            # what reset returns joins the prompt's end, which is cut to max_prompt_length tokens: no more
            # characters than those can hold are tokenized (10 MB took 20 s to tokenize whole)
            observation = seen.pop()[-self.max_prompt_length * self.tool_turns.max_token_chars :]
            if observation:
                messages[-1] = {**messages[-1], "content": f"{messages[-1]['content']}{observation}"}
            self.prompt_messages.append(messages)
            texts.append(render_with_tools(messages, self.tokenizer, self.toolbox.schemas,
                                           self.data.chat_template_kwargs))
        ids = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        return [row[-self.max_prompt_length :] for row in ids]

    # -- one turn ------------------------------------------------------------------------
    def take_turn(self, r: _Rollout, ids: list[int], logprobs: list[float] | None, no_eos: bool, turn: int) -> None:
        """Append a model turn (cut to the budget) and read its tool calls."""
        room = self.budget - len(r.ids)
        cut = len(ids) > room
        ids = ids[:room]
        r.ids += ids
        r.mask += [1] * len(ids)
        r.logprobs += list(logprobs[: len(ids)]) if logprobs is not None else []
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        calls = self.parse(text)
        message: dict[str, Any] = {"role": "assistant", "content": self.strip(text) if calls else text}
        if calls:
            message["tool_calls"] = [c.message() for c in calls]
        r.messages.append(message)
        if no_eos or cut:
            r.done = r.truncated = True   # the turn did not end: its calls are not run
        elif not calls:
            r.reply = self.toolbox.responds  # an answer: the environment sees it (and may reply)
            r.done = not r.reply
        elif turn == self.section.max_turns or ids[-1] != self.tokenizer.eos_token_id:
            r.done = True                 # the last turn; or a stop token after which the
                                          # template's tool turn cannot follow (<|endoftext|>)
        else:
            limit = self.section.max_tool_calls
            r.calls = calls[:limit] + [ToolCall(c.name, error=f"more than {limit} tool calls in one turn; "
                                                f"this one was not run") for c in calls[limit:]]

    def take_results(self, r: _Rollout, outcomes: list[Outcome], stats: TurnStats) -> None:
        """Count the calls, then splice their results in as a tool turn (cut to what the budget has
        room for, leaving the model one token at least; none where not even that fits)."""
        known = set(self.toolbox.tool_names)
        for call, outcome in zip(r.calls, outcomes, strict=True):
            stats.calls += 1
            stats.errors += outcome.error
            stats.timeouts += outcome.timed_out
            if call.name in known:
                stats.by_tool[call.name] = stats.by_tool.get(call.name, 0) + 1
        messages = [{"role": "tool", "name": c.name, "content": o.content} for c, o in zip(r.calls, outcomes)]
        r.calls = []
        fitted = self.tool_turns.fit(messages, self.budget - len(r.ids) - 1)  # a result too long for it: cut
        if fitted is None:  # no room left for the model to answer
            r.done = r.truncated = True
            return
        messages, ids = fitted
        r.messages += messages
        r.ids += ids
        r.mask += [0] * len(ids)
        r.logprobs += [0.0] * len(ids)


    def take_reply(self, r: _Rollout, env: Any, prompt: list[dict[str, Any]], stats: TurnStats, *,
                   last: bool) -> None:
        """The environment's answer to a turn without a call (``respond(messages)``: the prompt's
        messages and the conversation so far), spliced in as a user turn; None ends the rollout.
        On the ``last`` turn (or after a stop token no turn can follow) the environment still sees
        the answer, and what it returns is dropped: the rollout ends."""
        r.reply = False
        text = self.environment.respond(env, [*prompt, *r.messages])
        if text is None or last or r.ids[-1] != self.tokenizer.eos_token_id:
            r.done = True
            return
        fitted = self.tool_turns.fit([{"role": "user", "content": text}], self.budget - len(r.ids) - 1)
        if fitted is None:  # no room left for the model to answer
            r.done = r.truncated = True
            return
        stats.replies += 1
        messages, ids = fitted
        r.messages += messages
        r.ids += ids
        r.mask += [0] * len(ids)
        r.logprobs += [0.0] * len(ids)
