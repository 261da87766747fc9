"""A reward model as a reward: a local sequence-classification checkpoint scores each completion.

Follows TRL's GRPOTrainer (``reward_funcs="path"`` and ``_calculate_rewards``): the checkpoint
loads with ``AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)`` and its
own tokenizer (eos as pad when it has no pad token; the model's ``pad_token_id`` set to the
tokenizer's, as the model scores the last non-pad token). Conversational rows are rendered with
the reward tokenizer's chat template over prompt + completion messages, plain text rows are
prompt + completion; the texts are tokenized with right padding and no added special tokens,
and the reward is ``logits[:, 0]``. It runs in eval mode without gradients, ``batch_size``
completions per forward pass (default: the whole batch at once, as TRL).

``check_reward_model_dir`` is what ``grpo train --dry-run`` runs: it reads config.json and
lists files, importing neither torch nor transformers. The model loads at the first batch it
scores (once per directory and device, shared by entries that name the same directory).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from grpocli.errors import UserError

WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
TOKENIZER = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
SAVE_HINT = "save one with model.save_pretrained(DIR) and tokenizer.save_pretrained(DIR)"

_cache: dict[tuple[str, str], tuple[Any, Any]] = {}
_cache_lock = threading.Lock()


def check_reward_model_dir(name: str, *, where: str) -> Path:
    """The directory ``name`` as a Path once it looks like a one-label sequence-classification
    checkpoint with its tokenizer; UserError (at ``where``) saying what is missing otherwise."""
    path = Path(name).expanduser()
    config_file = path / "config.json"
    valid = ("a directory with config.json (a ...ForSequenceClassification architecture, one label), "
             "the weights and the tokenizer files")
    if not config_file.is_file():
        raise UserError(f"reward model directory {name!r} has no config.json", where=where, valid=valid,
                        hint=SAVE_HINT)
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UserError(f"{config_file} cannot be read as JSON: {err}", where=where, valid=valid,
                        hint=SAVE_HINT) from None
    architectures = config.get("architectures") or []
    if not any(str(a).endswith("ForSequenceClassification") for a in architectures):
        arch = ", ".join(map(str, architectures)) or "no architecture"
        raise UserError(
            f"{name!r} holds a {arch} checkpoint, not a sequence-classification (reward) model: "
            "its score head would start random",
            where=where, valid=valid,
            hint="name a reward model (e.g. one trained with TRL's RewardTrainer), or a function as "
            "module:function",
        )
    labels = config.get("id2label")
    if isinstance(labels, dict) and len(labels) != 1:
        raise UserError(
            f"reward model {name!r} has {len(labels)} labels; a reward model scores with one (logits[:, 0])",
            where=where, valid=valid, hint="save the reward model with num_labels=1",
        )
    files = {p.name for p in path.iterdir()}
    if not files & set(WEIGHTS):
        raise UserError(f"reward model directory {name!r} has no weights ({' or '.join(WEIGHTS[::2])})",
                        where=where, valid=valid, hint=SAVE_HINT)
    if not files & set(TOKENIZER):
        raise UserError(f"reward model directory {name!r} has no tokenizer ({' or '.join(TOKENIZER[:2])})",
                        where=where, valid=valid,
                        hint="save the reward model's tokenizer into it: tokenizer.save_pretrained(DIR)")
    return path


class RewardModel:
    """``fn(prompts, completions, **kwargs) -> list[float]``: a reward model's score per completion."""

    def __init__(self, path: str | Path, *, label: str | None = None, batch_size: int | None = None,
                 device: str | None = None, entry: str = "rewards") -> None:
        self.path = Path(path).expanduser().resolve()
        self.__name__ = label or self.path.name  # reward tables and TRL's get_callable_name read it
        self.batch_size = batch_size
        self.device = device
        self.entry = entry  # "rewards[i]": where errors point
        self.where = f"{entry} ({self.__name__})"

    def __repr__(self) -> str:
        return f"RewardModel({str(self.path)!r}, batch_size={self.batch_size}, device={self.device!r})"

    def __call__(self, prompts: list, completions: list, **kwargs: Any) -> list[float]:
        import torch

        model, tokenizer = self.load()
        texts = self.texts(prompts, completions, tokenizer)
        size = self.batch_size or max(len(texts), 1)
        scores: list[float] = []
        with torch.no_grad():
            for start in range(0, len(texts), size):
                inputs = tokenizer(text=texts[start : start + size], return_tensors="pt", padding=True,
                                   padding_side="right", add_special_tokens=False).to(model.device)
                scores.extend(model(**inputs).logits[:, 0].float().tolist())
        return scores

    @staticmethod
    def texts(prompts: list, completions: list, tokenizer: Any) -> list[str]:
        """What the reward model reads, as TRL builds it: the chat template over prompt +
        completion messages for conversational rows, else prompt + completion."""
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts for {len(completions)} completions")
        if prompts and _conversational(prompts[0]):
            return [tokenizer.apply_chat_template(list(p) + list(c), tokenize=False)
                    for p, c in zip(prompts, completions)]
        return [p + c for p, c in zip(prompts, completions)]

    def load(self) -> tuple[Any, Any]:
        """The model (eval mode, on its device) and tokenizer; loaded once per directory and device."""
        device = self._device()
        key = (str(self.path), str(device))
        with _cache_lock:
            if key not in _cache:
                _cache[key] = self._load(device)
            return _cache[key]

    def check_device(self) -> None:
        """UserError for a ``device`` that torch does not know or this machine lacks."""
        self._device()

    def _device(self) -> Any:
        import torch

        if self.device is None:
            return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
                else torch.device("cpu")
        try:
            device = torch.device(self.device)
        except (RuntimeError, ValueError) as err:
            raise UserError(f"device {self.device!r} is not a torch device: {err}",
                            where=f"{self.entry}.device",
                            valid="'cpu', 'cuda', 'cuda:N', or another torch device name") from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise UserError(f"device {self.device!r} is set but CUDA is not available",
                            where=f"{self.entry}.device", valid="'cpu' on this machine",
                            hint="leave device out to use the current CUDA device, or cpu without one")
        return device

    def _load(self, device: Any) -> tuple[Any, Any]:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
            model = AutoModelForSequenceClassification.from_pretrained(
                self.path, num_labels=1, local_files_only=True, dtype="auto")
        except (OSError, ValueError, RuntimeError) as err:
            raise UserError(f"reward model {self.path} failed to load: {type(err).__name__}: {err}",
                            where=self.where, valid="a directory saved with save_pretrained",
                            hint=SAVE_HINT) from None
        if tokenizer.pad_token_id is None:
            if tokenizer.eos_token is None:
                raise UserError(f"the tokenizer of reward model {self.path} has neither a pad nor an eos token",
                                where=self.where, valid="a tokenizer with a pad (or eos) token",
                                hint="set tokenizer.pad_token and save it again")
            tokenizer.pad_token = tokenizer.eos_token
        # The model scores the last non-pad token, so it must know the tokenizer's pad id (as TRL).
        model.config.get_text_config().pad_token_id = tokenizer.pad_token_id
        model.requires_grad_(False)
        return model.to(device).eval(), tokenizer


def _conversational(prompt: Any) -> bool:
    """TRL's is_conversational for a prompt: a list of {role, content} messages."""
    return (isinstance(prompt, (list, tuple)) and bool(prompt) and isinstance(prompt[0], dict)
            and "role" in prompt[0] and "content" in prompt[0])
