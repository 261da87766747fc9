"""The built-in character-level tokenizer: built offline, from nothing, identically every time.

Used by the 'tiny' model (tests, the quickstart). One token per character of printable ASCII,
plus Qwen's chat special tokens (ChatML, as in Qwen2.5's tokenizer) and the reasoning tags as
single tokens, so that a tiny model can learn the format rewards in a few steps.

It is a Qwen2 tokenizer with a 104-entry vocabulary and no merges: the same pipeline as
transformers' Qwen2Tokenizer (NFC, Qwen's split regex, GPT-2 byte-level symbols, BPE, byte-level
decoder). That matters: transformers 5 (and vLLM through it) reloads any tokenizer saved next to
a ``model_type = "qwen2"`` config as Qwen2Tokenizer, rebuilding that pipeline from the saved
vocabulary, so a different pipeline would tokenize differently after a save/load round trip.

Token ids are part of the contract (checkpoints of tiny models store them); never reorder:

    0  <|endoftext|>   pad and bos (as in Qwen2.5)
    1  <|im_start|>
    2  <|im_end|>      eos (end of a chat turn, as in Qwen2.5-Instruct)
    3  <think>   4  </think>   5  <answer>   6  </answer>   (added tokens, not special:
                   they survive ``decode(..., skip_special_tokens=True)``)
    7  \\t   8  \\n                   (byte-level symbols "ĉ" and "Ċ")
    9 .. 103       printable ASCII " " (32, symbol "Ġ") .. "~" (126): id = ord(c) - 23

``decode(encode(s)) == s`` for every string over that alphabet. Other characters (non-ASCII,
control characters) have no token and are dropped by ``encode``, as Qwen2Tokenizer does with
bytes missing from its vocabulary.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, EOS_TOKEN)
TAG_TOKENS = ("<think>", "</think>", "<answer>", "</answer>")
CHARACTERS = ("\t", "\n", *(chr(c) for c in range(32, 127)))

#: Qwen2's pre-tokenization regex (transformers' tokenization_qwen2.PRETOKENIZE_REGEX).
QWEN2_SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

#: ChatML as Qwen2.5 writes it, without Qwen's default system message and tool calls.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def build_char_tokenizer(vocab_size: int | None = None) -> PreTrainedTokenizerFast:
    """The character-level tokenizer described in the module docstring (no files, no network).

    `vocab_size` (a real model's embedding rows, for benchmarks at its shape): ids 104.. are filler
    tokens `<t104>`, `<t105>`, ... that encoding never produces (there are no merges) and decoding
    writes out as they read, so a model that samples them yields completions of varied length.
    """
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
    )
    from transformers import PreTrainedTokenizerFast

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    symbols = [byte_level.pre_tokenize_str(c)[0][0] for c in CHARACTERS]  # " " -> "Ġ", ...
    vocab = {t: i for i, t in enumerate((*SPECIAL_TOKENS, *TAG_TOKENS, *symbols))}
    vocab.update({f"<t{i}>": i for i in range(len(vocab), vocab_size or 0)})
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False))
    core.normalizer = normalizers.NFC()
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated"), byte_level]
    )
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPECIAL_TOKENS])
    core.add_tokens([AddedToken(t, normalized=False, special=False) for t in TAG_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        padding_side="right",
        model_max_length=32768,
    )
