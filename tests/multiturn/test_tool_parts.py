"""The parts of multi-turn rollouts that need no model: parsing, running tools (timeouts,
errors, concurrency), schemas, the chat template's tool turn, the built-in tool and environment,
and the recipe checks (`grpo train --dry-run`, exit 2 with the reason)."""

from __future__ import annotations

import threading
import time

import pytest
from cli_runner import run_grpo

from grpocli.errors import UserError
from grpocli.multiturn.builtin import (
    GuessNumber,
    calculator,
    environment_reward,
    guess_number_dataset,
)
from grpocli.multiturn.execution import run_turn
from grpocli.multiturn.parsers import (
    TOOL_CALL_PARSERS,
    ToolCall,
    parse_hermes,
    strip_hermes,
)
from grpocli.multiturn.template import ToolTurns, render_with_tools
from grpocli.multiturn.toolbox import tool_from_function


# -- parsing ---------------------------------------------------------------------------------
def test_hermes_reads_qwen_and_smollm2_calls():
    qwen = 'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*34"}}\n</tool_call>'
    smol = '<tool_call>[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": "{\\"y\\": 2}"}]</tool_call>'
    assert parse_hermes(qwen) == [ToolCall("calculator", {"expression": "12*34"})]
    assert parse_hermes(smol) == [ToolCall("a", {"x": 1}), ToolCall("b", {"y": 2})]
    assert strip_hermes(qwen) == "Let me compute."
    assert parse_hermes("The answer is 408.") == []
    assert TOOL_CALL_PARSERS["hermes"][0] is parse_hermes


def test_unreadable_calls_become_error_calls():
    broken, nameless, unclosed = parse_hermes('<tool_call>{"name": "calc", </tool_call>'
                                              '<tool_call>{"arguments": {}}</tool_call>'
                                              '<tool_call>{"name": "calc", "arguments": [1]}')
    assert "not valid JSON" in broken.error
    assert "must be {" in nameless.error
    assert unclosed.name == "calc" and "must be a JSON object" in unclosed.error


# -- running tools ---------------------------------------------------------------------------
def test_a_hanging_tool_times_out_a_raising_one_reports_and_the_rest_run():
    release = threading.Event()

    def hang(seconds: int) -> str:
        release.wait(60)
        return "late"

    def boom() -> str:
        raise RuntimeError("disk on fire")

    tools = {"hang": hang, "boom": boom, "echo": lambda text: text}
    calls = [[ToolCall("hang", {"seconds": 60}), ToolCall("echo", {"text": "after"})],
             [ToolCall("boom"), ToolCall("echo", {"text": "hi"})],
             [ToolCall("nope"), ToolCall("echo", {"wrong": 1}), ToolCall("x", error="not valid JSON")]]
    t0 = time.monotonic()
    out = run_turn(calls, [tools] * 3, timeout=0.5)
    took = time.monotonic() - t0
    release.set()
    assert 0.5 <= took < 2.0
    (hung, skipped), (raised, echoed), (unknown, bad_args, unparsed) = out
    assert hung.timed_out and hung.error and "did not return within 0.5 s" in hung.content
    assert skipped.error and "timed out" in skipped.content and not skipped.timed_out
    assert raised.content == "Error: RuntimeError: disk on fire" and raised.error
    assert echoed.content == "hi" and not echoed.error
    assert "unknown tool 'nope'" in unknown.content and "boom, echo, hang" in unknown.content
    assert bad_args.error and "TypeError" in bad_args.content
    assert unparsed.content == "Error: not valid JSON"


def test_rollouts_run_concurrently_and_each_rollout_in_order():
    order: list[str] = []

    def slow(tag: str) -> str:
        time.sleep(0.4)
        order.append(tag)
        return tag

    calls = [[ToolCall("slow", {"tag": f"{r}{k}"}) for k in range(2)] for r in "abcd"]
    t0 = time.monotonic()
    out = run_turn(calls, [{"slow": slow}] * 4, timeout=5)
    took = time.monotonic() - t0
    assert took < 1.4  # 4 rollouts x 2 calls of 0.4 s: 0.8 s together, 3.2 s one by one
    assert [[o.content for o in row] for row in out] == [[f"{r}0", f"{r}1"] for r in "abcd"]
    assert all(order.index(f"{r}0") < order.index(f"{r}1") for r in "abcd")


# -- schemas and templates -------------------------------------------------------------------
def test_a_typed_documented_function_is_a_tool_and_an_undocumented_one_is_refused():
    tool = tool_from_function(calculator, "tools[0].name")
    assert tool.name == "calculator"
    assert tool.schema["function"]["parameters"]["properties"]["expression"]["type"] == "string"
    assert tool.schema["function"]["parameters"]["required"] == ["expression"]

    def bare(x):
        return x

    with pytest.raises(UserError) as err:
        tool_from_function(bare, "tools[1].name")
    assert err.value.where == "tools[1].name" and "has no JSON schema" in err.value.what


def test_tool_turn_tokens_come_from_the_chat_template_alone():
    from grpocli.models import build_char_tokenizer

    tok = build_char_tokenizer()
    turns = ToolTurns(tok)
    messages = [{"role": "tool", "name": "calculator", "content": "408"}]
    assert turns.text(messages) == "\n<|im_start|>tool\n408<|im_end|>\n<|im_start|>assistant\n"
    ids = turns.ids(messages)
    assert ids[:2] == tok("\n<|im_start|>", add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == turns.text(messages)
    # the tiny template ignores `tools=`: the tools go into a system message instead
    prompt = render_with_tools([{"role": "user", "content": "12*34="}], tok, [tool_from_function(calculator, "t").schema])
    assert prompt.startswith("<|im_start|>system\n# Tools") and '"name": "calculator"' in prompt
    assert prompt.endswith("<|im_start|>user\n12*34=<|im_end|>\n<|im_start|>assistant\n")



class RecordingTokenizer:
    """A real tokenizer that remembers the longest text it was asked to tokenize."""

    def __init__(self, tok) -> None:
        self.tok, self.longest = tok, 0

    def __call__(self, text, **kwargs):
        self.longest = max(self.longest, *(len(t) for t in ([text] if isinstance(text, str) else text)))
        return self.tok(text, **kwargs)

    def __getattr__(self, name):
        return getattr(self.tok, name)


def test_a_tool_result_too_long_for_the_budget_is_cut_before_it_is_tokenized():
    from grpocli.models import build_char_tokenizer

    tok = RecordingTokenizer(build_char_tokenizer())
    turns = ToolTurns(tok)
    short = {"role": "tool", "name": "calculator", "content": "408"}
    assert turns.fit([short], 100) == ([short], turns.ids([short]))  # it fits: as it is
    huge = {"role": "tool", "name": "dump", "content": "x" * 10_000_000}
    messages, ids = turns.fit([short, huge], 200)
    assert len(ids) <= 200 and ids == turns.ids(messages)
    assert messages[0] == short  # the longest result is the one cut
    assert messages[1]["content"].startswith("xxxx")
    assert messages[1]["content"].endswith(" of 10000000 characters kept]")
    assert tok.longest <= 200 * turns.max_token_chars + 200  # never the 10 MB (tens of seconds to tokenize)
    assert turns.fit([huge], 10) is None  # not even the note fits: the rollout ends (truncated)


# -- built-ins -------------------------------------------------------------------------------
def test_calculator_is_exact_and_refuses_what_is_not_arithmetic():
    assert calculator("4821 * 37") == "178377"
    assert calculator("(123 + 45) x 67") == "11256"
    assert calculator("7 / 2") == "3.5"
    with pytest.raises(ValueError, match="not an expression"):
        calculator("__import__('os')")
    with pytest.raises(ZeroDivisionError):
        calculator("1/0")


def test_guess_number_environment_and_its_reward():
    rows = guess_number_dataset("train", 0, num_samples=3, low=1, high=10)
    assert rows == guess_number_dataset("train", 0, num_samples=3, low=1, high=10)
    game = GuessNumber(low=1, high=10)
    assert game.reset(**rows[0]) is None
    secret = rows[0]["secret"]
    assert game.guess(secret - 1 if secret > 1 else secret + 1) in ("Higher.", "Lower.")
    assert game.guess(secret).startswith("Correct!")
    assert game.get_reward() == pytest.approx(0.9)
    assert environment_reward([], [], environments=[game, GuessNumber(), object()]) == [pytest.approx(0.9), 0.0, None]


# -- the recipe ------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(("override", "where", "reason"), [
    ("generation.async_steps=1", "generation.async_steps", "background prefetcher"),
])
def test_unsupported_combinations_exit_2_with_the_reason(override, where, reason):
    done = run_grpo("train", "quickstart", 'tools=[{name="calculator"}]', override,
                    "generation.backend='vllm'" if "async" in override else "log.progress='none'", "--dry-run")
    assert done.returncode == 2, done.stderr
    assert f"{where}: {where} is not supported with [[tools]]" in done.stderr and reason in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_unknown_tool_names_the_valid_ones_and_the_calculator_recipe_validates():
    done = run_grpo("train", "quickstart", 'tools=[{name="calculater"}]', "--dry-run")
    assert done.returncode == 2
    assert "tools[0].name: unknown tool 'calculater' (did you mean \"calculator\"?)" in done.stderr
    assert "valid: calculator" in done.stderr and "Traceback" not in done.stderr
    ok = run_grpo("train", "smollm2_calculator", "--dry-run")
    assert ok.returncode == 0, ok.stderr
    assert '{ name = "calculator" }' in ok.stdout and "max_turns = 3" in ok.stdout


def test_inspect_plugins_lists_the_tools_and_environments():
    done = run_grpo("inspect", "plugins", env={"COLUMNS": "160"})
    assert done.returncode == 0, done.stderr
    tools = done.stdout[done.stdout.index("\ntools\n"):]
    assert "calculator" in tools and "Evaluate an arithmetic expression" in tools
    environments = tools[tools.index("\nenvironments\n"):]
    assert "guess_number" in environments and "grpocli.multiturn.builtin" in environments
