"""Prompt templating and chat-template rendering with the real offline tokenizer."""

from __future__ import annotations

import copy

import pytest

from grpocli.data.template import (
    RenderedPrompts,
    build_messages,
    complete_rows,
    preview,
    render_prompt,
    render_row,
)
from grpocli.errors import UserError
from grpocli.recipe.schema import DataSection

MESSAGES = [{"role": "user", "content": "2+2="}]


def test_template_and_system_prompt_make_messages():
    data = DataSection(template="Solve: {question}", system_prompt="Be brief.")
    assert build_messages({"question": "1+1?", "answer": "2"}, data) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Solve: 1+1?"},
    ]


def test_prompt_column_used_as_is_without_template():
    assert build_messages({"prompt": "3*3="}, DataSection()) == [{"role": "user", "content": "3*3="}]
    data = DataSection(prompt_column="q")
    assert build_messages({"q": "x"}, data) == [{"role": "user", "content": "x"}]


def test_message_prompts_get_the_system_prompt_only_when_missing():
    data = DataSection(system_prompt="S")
    row = {"prompt": copy.deepcopy(MESSAGES)}
    assert build_messages(row, data) == [{"role": "system", "content": "S"}, *MESSAGES]
    assert row["prompt"] == MESSAGES  # the row is not changed
    own = [{"role": "system", "content": "mine"}, *MESSAGES]
    assert build_messages({"prompt": own}, data) == own


def test_template_naming_a_missing_column_says_which_and_what_exists():
    with pytest.raises(UserError) as err:
        build_messages({"question": "q", "answer": 1}, DataSection(template="{problem}"))
    assert err.value.where == "data.template"
    assert "'problem'" in err.value.what
    assert "question, answer" in err.value.valid


def test_missing_prompt_column_names_the_key_and_columns():
    with pytest.raises(UserError) as err:
        build_messages({"question": "q"}, DataSection())
    assert err.value.where == "data.prompt_column"
    assert "'prompt'" in err.value.what and "question" in err.value.valid


@pytest.mark.parametrize("template", ["{", "{0}", "{question.nope}"])
def test_broken_format_strings_are_user_errors(template):
    with pytest.raises(UserError) as err:
        build_messages({"question": "q"}, DataSection(template=template))
    assert err.value.where == "data.template"


def test_non_text_prompt_column_is_rejected():
    with pytest.raises(UserError, match="holds int"):
        build_messages({"prompt": 7}, DataSection())


def test_chat_template_rendering_with_system_prompt(tokenizer):
    messages = build_messages({"prompt": "12+7="}, DataSection(system_prompt="Answer."))
    text = render_prompt(messages, tokenizer, use_chat_template=True)
    assert text == (
        "<|im_start|>system\nAnswer.<|im_end|>\n"
        "<|im_start|>user\n12+7=<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_plain_rendering_when_off_or_when_tokenizer_has_no_template(tokenizer):
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    assert render_prompt(messages, tokenizer, use_chat_template=False) == "S\nQ"
    bare = copy.copy(tokenizer)
    bare.chat_template = None
    assert render_prompt(messages, bare, use_chat_template=True) == "S\nQ"


def test_chat_template_that_rejects_system_role_names_the_key(tokenizer):
    strict = copy.copy(tokenizer)
    strict.chat_template = (
        "{% if messages[0]['role'] == 'system' %}"
        "{{ raise_exception('System role not supported') }}{% endif %}"
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    with pytest.raises(UserError, match="System role not supported") as err:
        render_prompt([{"role": "system", "content": "S"}, *MESSAGES], strict, True)
    assert err.value.where == "data.chat_template"


def test_rendered_row_gives_rewards_the_prompt_as_trl_would(tokenizer):
    row = render_row({"prompt": "1+1=", "answer": 2}, DataSection(), tokenizer)
    assert row["prompt"] == "1+1=" and row["answer"] == 2  # a text prompt stays text
    data = DataSection(system_prompt="S")
    row = render_row({"prompt": "1+1=", "answer": 2}, data, tokenizer)
    # a system prompt makes a conversation, as open-r1's make_conversation does before TRL's rewards see it
    assert row["prompt"] == [{"role": "system", "content": "S"}, {"role": "user", "content": "1+1="}]
    assert row["prompt_text"].endswith("<|im_start|>user\n1+1=<|im_end|>\n<|im_start|>assistant\n")
    conversational = render_row({"prompt": MESSAGES}, data, tokenizer)
    assert conversational["prompt"] == MESSAGES  # as TRL passes conversational prompts
    templated = render_row({"question": "q"}, DataSection(template="Q: {question}"), tokenizer)
    assert templated["prompt"] == "Q: q"


def test_rendered_prompts_name_the_failing_row(tokenizer):
    rows = [{"question": "a"}, {"other": "b"}]
    prompts = RenderedPrompts(rows, DataSection(template="{question}", chat_template="always"), tokenizer)
    assert len(prompts) == 2 and prompts[0]["prompt_text"].endswith("a<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(UserError) as err:
        prompts[1]
    assert err.value.where == "data.template (row 1)"
    with pytest.raises(UserError, match="row 0"):  # checked when built, before any training
        RenderedPrompts(rows[1:], DataSection(template="{question}"), tokenizer)


def test_complete_rows_renders_only_what_lacks_prompt_text(tokenizer):
    done = {"prompt": "x", "prompt_text": "already"}
    out = complete_rows([done, {"prompt": "y"}], DataSection(chat_template=False), tokenizer)
    assert out == [done, {"prompt": "y", "prompt_text": "y"}]


def test_rendered_prompts_are_encoded_truncated_on_the_left(tokenizer):
    from grpocli.generation.base import (
        PromptEncoder,  # what every generation backend encodes with
    )

    encoder = PromptEncoder()
    encoder.tokenizer, encoder.max_prompt_length = tokenizer, 4
    long, short = encoder.encode_prompts(["abcdef", "ab"])
    assert tokenizer.decode(long) == "cdef" and tokenizer.decode(short) == "ab"


def test_preview_gives_first_rows_with_token_counts(tokenizer):
    import datasets

    prompts = ["1+1=", "22+3=", "9-9="]
    ds = datasets.Dataset.from_list([{"prompt": p, "answer": i} for i, p in enumerate(prompts)])
    data = DataSection(chat_template=False, max_prompt_length=4)
    rows = preview(ds, data, tokenizer, n=2)
    assert [(r["prompt"], r["answer"], r["prompt_tokens"], r["truncated"]) for r in rows] == [
        ("1+1=", 0, 4, False),
        ("22+3=", 1, 5, True),
    ]


def test_auto_follows_trl_plain_prompts_as_they_are_conversational_ones_templated(tokenizer):
    """TRL's rule by default: a plain-text prompt is sent as it is, chat messages get the template;
    'always' templates plain text too (true / false still mean always / never)."""
    plain = render_row({"prompt": "12+7="}, DataSection(), tokenizer)
    assert plain["prompt_text"] == "12+7=" and plain["prompt"] == "12+7="
    chat = render_row({"prompt": [{"role": "user", "content": "12+7="}]}, DataSection(), tokenizer)
    assert chat["prompt_text"] == "<|im_start|>user\n12+7=<|im_end|>\n<|im_start|>assistant\n"
    assert render_row({"prompt": "12+7="}, DataSection(chat_template="always"), tokenizer)["prompt_text"] == \
        chat["prompt_text"]
    assert DataSection(chat_template=True).chat_template == "always"
    assert DataSection(chat_template=False).chat_template == "never"
    # a recipe system prompt makes a chat of a plain prompt (there is no plain-text system prompt)
    with_system = render_row({"prompt": "12+7="}, DataSection(system_prompt="S"), tokenizer)
    assert with_system["prompt_text"].startswith("<|im_start|>system\nS<|im_end|>")


def test_a_rows_own_system_message_is_kept_and_the_override_is_announced(tokenizer, capsys):
    own = [{"role": "system", "content": "mine"}, {"role": "user", "content": "q"}]
    rows = [{"prompt": own}, {"prompt": [{"role": "user", "content": "q"}]}, {"prompt": own}]
    prompts = RenderedPrompts(rows, DataSection(system_prompt="recipe's"), tokenizer)
    assert "not used for 2 of 3 rows" in capsys.readouterr().err
    assert prompts[0]["prompt_text"].startswith("<|im_start|>system\nmine<|im_end|>")
    assert prompts[1]["prompt_text"].startswith("<|im_start|>system\nrecipe's<|im_end|>")
    RenderedPrompts(rows, DataSection(), tokenizer)  # no recipe system prompt: nothing to say
    assert capsys.readouterr().err == ""
