"""Load the tokenizer, the policy and the reference model named by a [model] section.

``name_or_path = "tiny"`` builds a tiny Qwen2 model (grpocli.models.tiny) with the built-in
character tokenizer (grpocli.models.tokenizer); anything else is a local directory, a GGUF file
(or a folder or installed package holding one) or a hub id, loaded with transformers' Auto classes
after grpocli.models.source has checked it.

A GGUF model is dequantized at load time into ordinary dense weights in ``model.dtype``
(transformers' ``GgufConfig(dequantize=True)``, which also drops the quantization state), so it
trains like any other model and its checkpoints are ordinary safetensors; its tokenizer, chat
template included, is read from the same file. That happens once per file: later loads read the
dense copy grpocli.models.gguf_copy keeps (``model.gguf_cache``).

The reference model is a separate frozen copy of the *base* weights (no LoRA adapters), loaded
the same way as the policy: for 'tiny' with the same seed, so it equals the initial policy
bit for bit; with LoRA it equals the initial policy because peft initialises lora_B to zero.
(A trainer short of memory can instead run the policy under ``policy.disable_adapter()``.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from grpocli.errors import UserError
from grpocli.models.gguf_copy import dense, dense_source, gguf_kwargs
from grpocli.models.source import Source, resolve

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from grpocli.recipe.schema import Lora, ModelSection

TINY = "tiny"


def load_tokenizer(model: ModelSection) -> PreTrainedTokenizerBase:
    """The tokenizer of ``model.tokenizer`` (default: the model's); no pad token -> eos as pad."""
    name = model.tokenizer or model.name_or_path
    key = "model.tokenizer" if model.tokenizer else "model.name_or_path"
    if name == TINY:
        from grpocli.models.tokenizer import build_char_tokenizer

        return build_char_tokenizer(vocab_size=model.tiny.vocab_size)
    source = resolve(name, key=key, what="tokenizer", gguf=True)
    if model.gguf_cache:
        source = dense_source(source, _torch_dtype(model.dtype))
    from transformers import AutoTokenizer

    kwargs: dict[str, Any] = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            source.path,
            local_files_only=source.local_files_only,
            trust_remote_code=model.trust_remote_code,
            **kwargs,
        )
    except (OSError, ValueError) as err:
        raise _load_error("tokenizer", source, key, err) from None
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise UserError(
                f"the tokenizer of {source.path} has neither a pad nor an eos token",
                where=key,
                valid="a tokenizer with an eos token (used as pad when there is no pad token)",
                hint="set model.tokenizer to a chat model's tokenizer, e.g. its -Instruct variant",
            )
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def check_model(model: ModelSection) -> None:
    """Check, without loading anything or asking the hub, that the model and tokenizer of ``model``
    can be found locally: for ``grpo train --dry-run`` and the checks before a run.

    A missing path, a folder with no or several GGUF files, a packaged model whose package is not
    installed or a missing ``gguf`` package is a UserError here, in well under a second. A hub id
    is only checked for its spelling (loading it checks the hub).
    """
    names = [("model.name_or_path", model.name_or_path, "model")]
    if model.tokenizer:
        names.append(("model.tokenizer", model.tokenizer, "tokenizer"))
    else:
        names.append(("model.name_or_path", model.name_or_path, "tokenizer"))
    for key, name, what in names:
        if name != TINY:
            resolve(name, key=key, what=what, gguf=True, hub=False)


def load_policy(model: ModelSection, seed: int, *, device: Any = None) -> PreTrainedModel:
    """The trainable policy: base weights, gradient checkpointing and LoRA adapters if asked.

    With LoRA the result is a peft ``PeftModel`` whose only trainable parameters are the adapters.
    A CUDA `device` loads the weights straight onto it (never whole in host memory: every process
    of a node loads its own copy); other devices load on the host and move there.
    """
    policy = _load_base(model, seed, device)
    if model.gradient_checkpointing is True:  # "auto" is decided before a model loads (grpocli.trainer.autofit)
        # Non-reentrant checkpointing needs no enable_input_require_grads with frozen inputs (LoRA).
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        policy.config.use_cache = False
    if model.lora.enabled:
        policy = _wrap_lora(policy, model.lora, seed)
    # Training mode, as a tiny model built from its config already is: from_pretrained returns eval mode,
    # where transformers skips gradient checkpointing (it checks `self.training`) and LoRA's dropout.
    policy.train()
    return policy.to(device) if device is not None else policy


def load_reference(model: ModelSection, seed: int, *, device: Any = None) -> PreTrainedModel:
    """A frozen copy of the initial base weights (eval mode, requires_grad False), for the KL;
    `device` as for `load_policy`."""
    reference = _load_base(model, seed, device)
    reference.eval()
    reference.requires_grad_(False)
    return reference.to(device) if device is not None else reference


def _load_base(model: ModelSection, seed: int, device: Any = None) -> PreTrainedModel:
    """The model named by ``model.name_or_path`` in ``model.dtype``, without adapters (loaded
    straight onto a CUDA `device`)."""
    if model.name_or_path == TINY:
        from grpocli.models.tiny import build_tiny_model

        tokenizer = load_tokenizer(model)
        try:
            base = build_tiny_model(
                model.tiny, tokenizer, seed, attn_implementation=model.attn_implementation
            )
        except (ValueError, ImportError) as err:
            raise _attn_error(model, err) or err
        dtype = _torch_dtype(model.dtype)
        return base if dtype == "auto" else base.to(dtype)
    source = resolve(model.name_or_path, key="model.name_or_path", gguf=True)
    if model.gguf_cache:
        source = dense_source(source, _torch_dtype(model.dtype))
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"trust_remote_code": model.trust_remote_code}
    if model.attn_implementation:
        kwargs["attn_implementation"] = model.attn_implementation
    if source.gguf_file:
        kwargs.update(gguf_kwargs(source))
    if device is not None and str(device).startswith("cuda"):
        kwargs["device_map"] = {"": str(device)}  # shards go to the GPU as they load
    try:
        loaded = AutoModelForCausalLM.from_pretrained(
            source.path,
            dtype=_torch_dtype(model.dtype),
            local_files_only=source.local_files_only,
            **kwargs,
        )
    except (OSError, ValueError, ImportError, KeyError) as err:  # KeyError: GGUF metadata missing
        if isinstance(err, KeyError) and not source.gguf_file:
            raise
        attn_error = _attn_error(model, err)
        raise attn_error or _load_error("model", source, "model.name_or_path", err) from None
    return dense(loaded) if source.gguf_file else loaded


def _wrap_lora(policy: PreTrainedModel, lora: Lora, seed: int) -> PreTrainedModel:
    """peft's get_peft_model with the recipe's LoraConfig; lora_A is initialised from ``seed``."""
    import torch

    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise UserError(
            "model.lora.enabled = true needs the peft package, which is not installed",
            where="model.lora.enabled",
            valid="peft installed, or model.lora.enabled = false",
            hint="pip install 'grpocli[peft]'",
        ) from None
    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        task_type="CAUSAL_LM",
    )
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return get_peft_model(policy, config)
    except ValueError as err:
        linear = sorted(
            {
                name.rsplit(".", 1)[-1]
                for name, module in policy.named_modules()
                if isinstance(module, torch.nn.Linear)
            }
        )
        raise UserError(
            f"peft could not add LoRA adapters: {err}",
            where="model.lora.target_modules",
            valid=f"'all-linear' or names among {linear}",
        ) from None


def _torch_dtype(name: str) -> torch.dtype | str:
    """'auto' stays 'auto' (the checkpoint's dtype); other names become torch dtypes."""
    if name == "auto":
        return "auto"
    import torch

    return getattr(torch, name)


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _attn_error(model: ModelSection, err: Exception) -> UserError | None:
    """A UserError naming model.attn_implementation when that is what ``err`` is about."""
    text = str(err).lower()
    if not model.attn_implementation or not ("attn_implementation" in text or "flash" in text):
        return None
    return UserError(
        f"attn_implementation {model.attn_implementation!r} cannot be used: {_first_line(err)}",
        where="model.attn_implementation",
        valid="unset (transformers picks sdpa), 'sdpa', 'eager', or 'flash_attention_2' with "
        "the flash-attn package on a GPU",
        hint="leave model.attn_implementation unset, or pip install flash-attn on a GPU machine",
    )


def _load_error(what: str, source: Source, key: str, err: Exception) -> UserError:
    if source.gguf_file:
        return UserError(
            f"the {what} in the GGUF file {source.path}/{source.gguf_file} could not be loaded: "
            f"{_first_line(err)}",
            where=key,
            valid="a GGUF file of an architecture transformers reads (llama, mistral, qwen2, qwen3, "
            "gemma, phi3, ...; see transformers' GGUF documentation)",
            hint="upgrade transformers, or load the original (safetensors) model as a directory or hub id",
        )
    return UserError(
        f"the {what} at {source.path} could not be loaded: {_first_line(err)}",
        where=key,
        valid="a directory written by save_pretrained, or a hub id of a causal language model",
        hint="if the architecture is unknown, upgrade transformers or set "
        "model.trust_remote_code = true (runs code from the hub)",
    )
