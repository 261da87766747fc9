"""The built-in character tokenizer: ids, round trips, special tokens, chat template."""

from __future__ import annotations

import pytest

from grpocli.models.tokenizer import CHAT_TEMPLATE, build_char_tokenizer


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.mark.parametrize(
    "text",
    [
        "Hello  world!",
        " leading and trailing spaces  ",
        "line one\nline two\n\n\tindented",
        "a , b . c ' s don't 3+4=7 ?!",
        "What is 12 * (3 - 1)? Answer: 24 ~`@#$%^&{}[]|\\\"<>",
    ],
)
def test_decode_inverts_encode_one_token_per_character(tok, text):
    ids = tok.encode(text)
    assert len(ids) == len(text)
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special_tokens=True) == text


def test_ids_follow_the_documented_order(tok):
    assert len(tok) == 104
    assert tok.encode(" ~") == [9, 103]
    assert tok.encode("A\t\n") == [ord("A") - 23, 7, 8]
    assert (tok.pad_token_id, tok.eos_token_id) == (0, 2)
    assert tok.bos_token is None
    assert tok.convert_tokens_to_ids("<|im_start|>") == 1


def test_characters_outside_the_alphabet_are_dropped(tok):
    assert tok.decode(tok.encode("2×3\r=6é")) == "23=6"


def test_two_builds_are_identical(tok):
    assert build_char_tokenizer().backend_tokenizer.to_str() == tok.backend_tokenizer.to_str()


@pytest.mark.parametrize(
    ("token", "expected_id"),
    [("<think>", 3), ("</think>", 4), ("<answer>", 5), ("</answer>", 6), ("<|im_end|>", 2)],
)
def test_special_and_tag_tokens_are_single_ids(tok, token, expected_id):
    assert tok.encode(f"x{token}y") == [tok.encode("x")[0], expected_id, tok.encode("y")[0]]


def test_tags_survive_skipping_special_tokens_but_chat_tokens_do_not(tok):
    ids = tok.encode("<think>ok</think><answer>7</answer><|im_end|><|endoftext|>")
    assert tok.decode(ids, skip_special_tokens=True) == "<think>ok</think><answer>7</answer>"
    assert tok.decode(ids).endswith("</answer><|im_end|><|endoftext|>")


def test_chat_template_is_chatml(tok):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
    ]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    closed = tok.apply_chat_template(messages[1:], tokenize=False, add_generation_prompt=False)
    assert closed == "<|im_start|>user\n2+2?<|im_end|>\n"
    assert tok.chat_template == CHAT_TEMPLATE


def test_batches_pad_on_the_right_with_endoftext(tok):
    batch = tok(["ab", "abcd"], padding=True)
    assert tok.padding_side == "right"
    assert batch["input_ids"][0][2:] == [0, 0]
    assert batch["attention_mask"][0] == [1, 1, 0, 0]
