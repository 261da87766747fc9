"""GGUF models, dequantized once: a dense copy (safetensors weights, config, tokenizer) kept in grpo's
cache, so that every later load of the same file reads ordinary safetensors.

transformers reads a GGUF file slowly: its metadata is parsed once for the config, once for the
weights and once for the tokenizer (the vocabulary as numpy slices), and the tokenizer is rebuilt
from it in Python. SmolLM2-135M's tokenizer and policy take 14 s to load from the file on one idle core
here, 15 s the first time (converting), 0.7 s from the copy (docs/real-model.md, tests/bench/bench_gguf_load.py).

The copy holds the weights dequantized in the dtype asked (float32 for ``model.dtype = "auto"``, a
GGUF file's dequantized dtype), cast once exactly as transformers casts them after dequantizing, so
a model loaded from it equals the one loaded from the file, bit for bit. Its folder name carries the
file's size and modification time, the dtype and transformers' version: a changed file or another
transformers converts again. It is written into a temporary folder and renamed into place, so that a
killed conversion leaves no half copy behind and two processes converting at once both end with a
whole one. ``model.gguf_cache = false`` loads from the file every time, and a copy that cannot be
written (a read-only or full disk) is said once and the file loaded as before.

Where: ``$GRPO_CACHE_DIR/gguf``, else ``$XDG_CACHE_HOME/grpo/gguf``, else ``~/.cache/grpo/gguf``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpocli.errors import UserError

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from grpocli.models.source import Source

log = logging.getLogger(__name__)

#: The environment variable that moves grpo's cache (the GGUF copies live in its gguf/ folder).
CACHE_VARIABLE = "GRPO_CACHE_DIR"
#: The file a finished copy holds: what it was made from (also the mark that it is whole).
MADE_FROM = "grpo-gguf-copy.json"
#: Bumped when the copy's layout changes, so that older copies are not read.
LAYOUT = 1


def cache_folder() -> Path:
    """Where GGUF copies are kept: $GRPO_CACHE_DIR/gguf, $XDG_CACHE_HOME/grpo/gguf or ~/.cache/grpo/gguf."""
    if os.environ.get(CACHE_VARIABLE):
        return Path(os.environ[CACHE_VARIABLE]) / "gguf"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "grpo" / "gguf"


def dense_source(source: Source, dtype: Any) -> Source:
    """``source`` as a folder of dense safetensors: the copy of its GGUF file in ``dtype`` (a torch
    dtype or "auto"), made now if there is none. ``source`` itself when it is no GGUF file, or when
    the copy could not be made (the caller's load then says what is wrong with the file)."""
    if not source.gguf_file:
        return source
    target = cache_folder() / _copy_name(source, dtype)
    if not (target / MADE_FROM).exists():
        try:
            _convert(source, dtype, target)
        except (OSError, ValueError, ImportError, KeyError) as err:  # the same the direct load turns into UserErrors
            log.warning("could not keep a dense copy of %s in %s (%s); loading the GGUF file itself",
                        source.gguf_file, target.parent, str(err).splitlines()[0] if str(err) else type(err).__name__)
            return source
    return replace(source, path=str(target), local_files_only=True, gguf_file=None)


def _copy_name(source: Source, dtype: Any) -> str:
    """The copy's folder name: the file's stem, the dtype and a digest of what would change the copy."""
    import transformers

    file = Path(source.path) / str(source.gguf_file)
    stat = file.stat()
    dtype_name = str(dtype).removeprefix("torch.")
    made_from = f"{file.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{dtype_name}|{transformers.__version__}|{LAYOUT}"
    digest = hashlib.sha256(made_from.encode()).hexdigest()[:16]
    return f"{file.stem}-{dtype_name}-{digest}"


def _convert(source: Source, dtype: Any, target: Path) -> None:
    """Load the GGUF file (tokenizer, dequantized weights), save both into ``target`` (atomically)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpocli.models.files import save_pretrained_quietly

    log.info("converting %s to a dense copy in %s (once; later loads read the copy)", source.gguf_file, target)
    tokenizer = AutoTokenizer.from_pretrained(source.path, gguf_file=source.gguf_file, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(source.path, dtype=dtype, local_files_only=True, **gguf_kwargs(source))
    model = dense(model)
    target.parent.mkdir(parents=True, exist_ok=True)
    part = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        save_pretrained_quietly(model, part)
        tokenizer.save_pretrained(part)
        file = Path(source.path) / str(source.gguf_file)
        (part / MADE_FROM).write_text(json.dumps({"gguf_file": str(file.resolve()), "size": file.stat().st_size,
                                                  "dtype": str(dtype), "layout": LAYOUT}, indent=1), encoding="utf-8")
        try:
            os.rename(part, target)
        except OSError:
            if not (target / MADE_FROM).exists():  # not a process that finished the same copy first
                raise
    finally:
        shutil.rmtree(part, ignore_errors=True)


def gguf_kwargs(source: Source) -> dict[str, Any]:
    """from_pretrained arguments that load ``source.gguf_file`` as dense, trainable weights."""
    _cache_gguf_name_maps()
    kwargs: dict[str, Any] = {"gguf_file": source.gguf_file}
    try:  # transformers >= 5.19: without it, an installed `kernels` keeps some weights packed
        from transformers import GgufConfig

        kwargs["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:  # older releases always dequantize GGUF weights
        pass
    return kwargs


def _cache_gguf_name_maps() -> None:
    """transformers builds gguf's tensor-name map of the architecture once per module it visits (397
    times for SmolLM2-135M), a third of a GGUF load: the map depends only on (architecture, layers), so
    gguf's builder is memoized (SmolLM2-135M's load: 30.3 s -> 20.9 s, the first load in a process)."""
    import functools

    import gguf

    if not hasattr(gguf.get_tensor_name_map, "cache_info"):
        gguf.get_tensor_name_map = functools.cache(gguf.get_tensor_name_map)


def dense(model: PreTrainedModel) -> PreTrainedModel:
    """A GGUF-loaded model without the quantization state transformers attaches to it.

    The weights are already plain dense tensors (dequantized while loading); what is left of the
    GGUF quantizer (``model.hf_quantizer``, ``config.quantization_config``) would make
    ``save_pretrained`` refuse ("quantized with gguf and is not serializable") and make vLLM read
    the saved config as a GGUF-quantized model. GgufConfig(dequantize=True) removes them already;
    this covers releases without it, the same way transformers' own ``remove_quantization_config``.
    """
    if getattr(model, "hf_quantizer", None) is not None:
        del model.hf_quantizer
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if hasattr(model, "quantization_method"):
        del model.quantization_method
    model.is_quantized = False
    packed = [n for n, p in model.named_parameters() if not p.is_floating_point()]
    if packed:  # a weight left in GGUF blocks cannot be trained
        raise UserError(
            f"transformers kept {len(packed)} weights of the GGUF model packed (e.g. {packed[0]})",
            where="model.name_or_path",
            valid="a GGUF file transformers can dequantize",
            hint="upgrade transformers, or pip uninstall kernels",
        )
    return model
