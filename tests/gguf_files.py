"""A tiny GGUF model for tests (a module, like cli_runner, so test files in any folder can write one):
a tiny llama (random weights, seed 7) with the built-in character tokenizer, stored as a byte-level BPE
vocabulary (``tokenizer.ggml.model = "gpt2"``, Qwen2's split regex as ``pre = "qwen2"``), so that
transformers' GGUF tokenizer builder rebuilds exactly the same tokenizer, chat template included."""

from __future__ import annotations

import torch

from grpocli.models.tokenizer import SPECIAL_TOKENS, TAG_TOKENS

FILE = "tiny-llama.F32.gguf"
TEXT = "<|im_start|>user\nWhat is 12 + 7?<|im_end|>\n<think>12+7=19</think><answer>19</answer>"


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=104, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6,
        tie_word_embeddings=True, bos_token_id=0, eos_token_id=2, pad_token_id=0,
    )
    torch.manual_seed(7)
    return LlamaForCausalLM(config).eval()


def _permute(w, n_head: int, n_kv: int):
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows (transformers undoes it on load)."""
    n = n_kv if n_kv != n_head else n_head
    return w.reshape(n, 2, w.shape[0] // n // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(model, tokenizer, path) -> None:
    """``model`` (LlamaForCausalLM, tied embeddings) and ``tokenizer`` as an F32 GGUF file."""
    import gguf
    import numpy as np

    c = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    tokens = [t for t, _ in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([
        gguf.TokenType.CONTROL if t in SPECIAL_TOKENS
        else gguf.TokenType.USER_DEFINED if t in TAG_TOKENS else gguf.TokenType.NORMAL
        for t in tokens
    ])
    # No merges (one token per character): transformers then derives them from scores, to none.
    w.add_token_scores([0.0] * len(tokens))
    w.add_bos_token_id(tokenizer.convert_tokens_to_ids("<|endoftext|>"))
    w.add_eos_token_id(tokenizer.eos_token_id)
    w.add_pad_token_id(tokenizer.pad_token_id)
    w.add_chat_template(tokenizer.chat_template)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    for i in range(c.num_hidden_layers):
        for hf, g in [("input_layernorm", "attn_norm"), ("self_attn.q_proj", "attn_q"),
                      ("self_attn.k_proj", "attn_k"), ("self_attn.v_proj", "attn_v"),
                      ("self_attn.o_proj", "attn_output"), ("post_attention_layernorm", "ffn_norm"),
                      ("mlp.gate_proj", "ffn_gate"), ("mlp.up_proj", "ffn_up"), ("mlp.down_proj", "ffn_down")]:
            names[f"model.layers.{i}.{hf}.weight"] = f"blk.{i}.{g}.weight"
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    for hf, name in names.items():
        tensor = state[hf]
        if name.endswith("attn_q.weight"):
            tensor = _permute(tensor, c.num_attention_heads, c.num_attention_heads)
        elif name.endswith("attn_k.weight"):
            tensor = _permute(tensor, c.num_attention_heads, c.num_key_value_heads)
        w.add_tensor(name, np.ascontiguousarray(tensor, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
