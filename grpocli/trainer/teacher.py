"""distill.teacher: the model whose per-token log-probs the student learns from (on-policy distillation).

A teacher is opened before the policy loads, so a wrong one costs no model load:

  * an http(s):// URL: a `grpo ref-serve` holding the teacher (`ReferenceClient`, the same protocol and
    client as algorithm.reference = "server"); its vocabulary size (GET /info) must be the student's
    embedding size: the server does not send its tokenizer, so equal sizes are all that is checked;
  * a checkpoint directory (runs/NAME/checkpoints/step-N; LoRA adapters are merged into their base) or a
    run directory (its newest intact checkpoint), opened as `grpo eval --checkpoint` opens one;
  * anything model.name_or_path takes (a model directory, a packaged name, a .gguf file).

A local teacher's tokenizer must have the student's vocabulary, token for token (TRL's distillation
trainers check the same: `get_vocab()` equal); otherwise exit 2 naming both. The teacher is frozen (eval
mode, no gradient) and scores the student's completions in phase 5 of the loop, as the reference does.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpocli.errors import UserError

if TYPE_CHECKING:
    from grpocli.recipe.schema import Recipe

WHERE = "distill.teacher"


def open_teacher(r: Recipe, tokenizer: Any, *, device: Any = None) -> Any:
    """The local teacher of [distill] (None without one, or when it is served): a frozen model on ``device``."""
    d = r.distill
    if not d.on or d.served:
        return None
    section, adapter, seed, tried = _teacher_section(r)
    from grpocli.models import load_tokenizer

    try:
        theirs = load_tokenizer(section)
    except UserError as err:
        raise UserError(f"the teacher {d.teacher} could not be loaded ({'; '.join(tried)}): {err.what}",
                        where=WHERE, valid="a model directory, a checkpoint or run directory, a packaged model "
                        "name, a .gguf file, or the URL of a grpo ref-serve", hint=err.hint) from None
    check_vocabulary(tokenizer, theirs, student_name=r.model.tokenizer or r.model.name_or_path, teacher_name=d.teacher)
    from grpocli.models.export import CheckpointModel, open_model

    model = open_model(CheckpointModel(section, seed, adapter=adapter), device=device, where=WHERE)
    model.requires_grad_(False)
    return model


def connect_teacher(r: Recipe, policy: Any, parallel: Any) -> Any:
    """The served teacher of [distill] (None unless distill.teacher is a URL): a ReferenceClient whose model
    has as many token ids as the student's embeddings."""
    from grpocli.reference.client import KEY_ENV, ReferenceClient

    d = r.distill
    if not d.served:
        return None
    client = ReferenceClient(d.teacher, timeout=d.timeout, api_key=os.environ.get(KEY_ENV), parallel=parallel,
                             where=WHERE)
    client.wait_until_ready()
    served, ours = client.info.get("vocab_size"), int(policy.get_input_embeddings().num_embeddings)
    if served is not None and int(served) != ours:
        raise UserError(f"the teacher at {d.teacher} has a vocabulary of {served} token ids and the student "
                        f"({r.model.name_or_path}) has {ours}", where=WHERE,
                        valid="a teacher with the student's tokenizer (the same token ids)",
                        hint="serve a teacher of the student's model family: grpo ref-serve --model TEACHER_DIR")
    return client


def _teacher_section(r: Recipe) -> tuple[Any, Path | None, int, list[str]]:
    """(model section, LoRA adapters to merge, seed, what was tried) of a local teacher."""
    from grpocli.evaluation.targets import resolve_checkpoint
    from grpocli.models.export import checkpoint_model

    value = r.distill.teacher
    path = Path(value).expanduser()
    tried = []
    if path.is_dir() and not (path / "config.json").is_file() or (path / "checkpoints").is_dir():
        target = resolve_checkpoint(value, where=WHERE)  # a checkpoint or run directory (errors name it)
        tried.append(f"as the checkpoint {target.path}")
        cm = checkpoint_model(target.path, model=_teacher_model(r, str(target.path)), seed=r.train.seed, where=WHERE)
        return cm.section, cm.adapter, cm.seed, tried
    tried.append(f"as a model (model.name_or_path = {value!r}, model.dtype = {r.model.dtype!r})")
    return _teacher_model(r, value), None, r.train.seed, tried


def _teacher_model(r: Recipe, name: str) -> Any:
    """The student's [model] for inference, naming the teacher (no adapters, no checkpointing)."""
    return r.model.model_copy(update={"name_or_path": name, "tokenizer": None, "gradient_checkpointing": False,
                                      "lora": r.model.lora.model_copy(update={"enabled": False})})


def check_vocabulary(student: Any, teacher: Any, *, student_name: str, teacher_name: str) -> None:
    """UserError unless the two tokenizers map the same tokens to the same ids (TRL: get_vocab() equal)."""
    ours, theirs = student.get_vocab(), teacher.get_vocab()
    if ours == theirs:
        return
    differ = sum(1 for token, i in ours.items() if theirs.get(token) != i) + len(set(theirs) - set(ours))
    raise UserError(
        f"the teacher's tokenizer ({teacher_name}: {len(theirs)} tokens) is not the student's ({student_name}: {len(ours)} "
        f"tokens): {differ} tokens have another id or are missing from one of them", where=WHERE,
        valid="a teacher with the student's vocabulary: the per-token signal compares both models' log-probs "
        "of the same token ids (cross-tokenizer distillation is not supported)",
        hint="pick a teacher of the student's model family (the same tokenizer), or train the student from "
        "the teacher's family")


__all__ = ["check_vocabulary", "connect_teacher", "open_teacher"]
