"""The teacher of on-policy distillation ([distill], grpocli.recipe.distill_section) in the plan.

A teacher in process holds its weights beside the policy's (in model.dtype, as the reference model:
no gradient, no optimizer state; whole on every process, as grpocli.trainer.teacher loads it) and runs a no-grad forward pass over every completion in the
log-prob phase, as the reference does; a served teacher (an http(s):// distill.teacher, a
`grpo ref-serve`) holds nothing on the trainer. Its shape is read as the policy's is
(grpocli.planning.shapes.shape_of), from where distill.teacher points: a model directory, a
packaged or .gguf model, a hub id (its config.json alone), a checkpoint (LoRA adapters: their base
model, as grpocli.models.export opens them) or a run directory (its newest intact checkpoint).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from grpocli.errors import UserError
from grpocli.planning.shapes import ModelShape, dtype_bytes, shape_of

if TYPE_CHECKING:
    from grpocli.recipe.schema import ModelSection, Recipe

KEY = "distill.teacher"


def teacher_shape(r: Recipe) -> ModelShape | None:
    """The shape of the teacher `r` loads in process; None without distillation or with a served teacher."""
    d = getattr(r, "distill", None)
    if d is None or not d.on or d.served:
        return None
    return _shape(teacher_section(d.teacher, r.model).model_dump_json())


def teacher_weight_bytes(r: Recipe, teacher: ModelShape) -> int:
    """Bytes per teacher weight: model.dtype, as the reference's ('auto': the teacher's own config dtype)."""
    return dtype_bytes(r.model.dtype if r.model.dtype != "auto" else teacher.config_dtype)


@lru_cache(maxsize=16)
def _shape(section: str) -> ModelShape:
    """Read once per model: the plan's searches ask for the settings of a recipe many times."""
    from grpocli.recipe.schema import ModelSection

    return shape_of(ModelSection.model_validate_json(section), key=KEY)


def teacher_section(teacher: str, model: ModelSection) -> ModelSection:
    """The [model] whose shape is the teacher's: `model` (the student's) with name_or_path the teacher's
    model directory, checkpoint or name; a LoRA checkpoint's base model; a run directory's newest intact
    checkpoint's."""
    path = Path(teacher).expanduser()
    if path.is_dir() and (not (path / "config.json").is_file() or (path / "checkpoints").is_dir()):
        from grpocli.models.export import checkpoint_model, is_adapter

        if is_adapter(path):
            return checkpoint_model(path, where=KEY).section
        from grpocli.rundir import RunDir

        run = RunDir(path)
        if run.list_checkpoints():
            newest, damaged = run.newest_intact(resume=False)
            if newest is None:
                raise UserError(f"no checkpoint of the run {teacher} is intact: "
                                + "; ".join(d.render() for d in damaged), where=KEY,
                                valid="a run directory with an intact checkpoint, a checkpoint, or a model directory",
                                hint=f"grpo inspect {teacher}")
            return teacher_section(str(newest[1]), model)
    return model.model_copy(update={"name_or_path": str(path) if path.exists() else teacher})


__all__ = ["KEY", "teacher_section", "teacher_shape", "teacher_weight_bytes"]
