"""`grpo import trl` for TRL 1.16's distillation configs -> [distill] (grpocli.recipe.distill_section).

TRL's DistillationConfig (trl/trainer, `trl distillation`; ServerDistillationConfig extends it), GKDConfig and
IWOPDConfig (trl/experimental/gkd, iw_opd) and AsyncDistillationConfig's teacher_server_urls. GRPOConfig has no
teacher field in TRL 1.16, so a config is read as a distillation config when it sets a field only these have
(DISTILL_TYPES); its `beta` then selects the divergence (1.0: reverse KL), not GRPO's KL penalty.

What grpo trains is on-policy distillation on the sampled tokens: each completion token's advantage is the
teacher's log-prob minus the student's (distill.objective = 'reverse_kl'). That is IW-OPD with iw_opd_gamma = 0
exactly, and TRL's beta = 1.0 (reverse KL over the whole vocabulary at each position, fully on-policy) in
expectation: its policy gradient is the reverse KL's. Forward KL / JSD (beta < 1) need the teacher's whole
distribution, off-policy data (lmbda < 1, seq_kd) and IW-OPD's weights (gamma > 0) have no grpo equivalent:
each is an 'unsupported' line, and the recipe trains the reverse KL.
"""

from __future__ import annotations

import json
from typing import Any

from grpocli.errors import UserError
from grpocli.recipe.reward_import import rewards as _rewards

Json = dict[str, Any]
#: The value types of the distillation-only fields, as TRL annotates them (grpocli.recipe.trl_types checks them).
DISTILL_TYPES: dict[str, Any] = {
    "teacher_model_name_or_path": str | None, "teacher_model_revision": str | None,
    "teacher_model_init_kwargs": Json | str | None, "teacher_model_server_url": str | None,
    "use_teacher_server": bool, "teacher_server_urls": dict[str, str] | str | None, "lmbda": float, "seq_kd": bool,
    "distillation_objective": str, "iw_opd_gamma": float, "iw_opd_epsilon": float, "loss_top_k": int,
    "loss_add_tail": bool, "reverse_kl_top_1_mode": str, "max_new_tokens": int,
}  # IWOPDConfig's max_prompt_length is open-r1's too (grpocli.recipe.openr1_names): no sign of distillation
#: Which TRL class a config is read as (the first whose fields it sets), and that class's defaults.
KINDS = (
    ("IWOPDConfig", ("distillation_objective", "iw_opd_gamma", "iw_opd_epsilon", "use_teacher_server"),
     {"beta": 1.0, "lmbda": 1.0, "distillation_objective": "iw_opd", "iw_opd_gamma": 0.5}),
    ("GKDConfig", ("seq_kd", "max_new_tokens"), {"beta": 0.5, "lmbda": 0.5, "temperature": 0.9, "max_new_tokens": 128}),
    ("AsyncDistillationConfig", ("teacher_server_urls",), {"beta": 0.0}),
    ("ServerDistillationConfig", ("teacher_model_server_url",), {"beta": 1.0}),
    ("DistillationConfig", (), {"beta": 1.0}),
)
#: GRPOConfig's defaults (grpocli.recipe.trl_names.TRL_DEFAULTS) that the distillation configs do not have.
GRPO_ONLY = ("num_generations", "epsilon", "use_bias_correction_kl", "vllm_importance_sampling_mode",
             "vllm_importance_sampling_clip_max")
SERVED = ("a `grpo ref-serve` of the teacher (grpo ref-serve --model TEACHER --port N): TRL's teacher server is a "
          "vLLM server, which grpo does not ask for log-probs")


class Distillation:
    """A distillation config's own fields, taken out of those the GRPO table reads."""

    def __init__(self, kind: str, own: dict[str, Any], defaults: dict[str, Any]) -> None:
        self.kind, self.own, self.defaults = kind, own, defaults

    def value(self, name: str) -> Any:
        return self.own.get(name, self.defaults.get(name))

    def grpo_defaults(self, trl_defaults: dict[str, Any]) -> dict[str, Any]:
        """TRL's GRPOConfig defaults the GRPO table writes, as this class's."""
        out = {k: v for k, v in trl_defaults.items() if k not in GRPO_ONLY}
        if "max_new_tokens" in self.defaults:  # GKDConfig's completion length
            out["max_completion_length"] = self.defaults["max_new_tokens"]
        return out | {k: v for k, v in self.defaults.items() if k == "temperature"}

    def batch(self, b: Any, merged: dict[str, Any], nproc: int) -> None:
        """One completion per prompt (no num_generations, or IWOPDConfig's 1): grpo's least group, 2."""
        if (merged.get("num_generations") or 1) < 2:
            step = merged["per_device_train_batch_size"] * merged["gradient_accumulation_steps"] * nproc
            if step % 2:
                raise UserError(f"one optimizer step trains on {step} completions, one per prompt: grpo samples "
                                "at least 2 per prompt (generation.num_generations), so a step holds an even number",
                                where="per_device_train_batch_size", valid="per_device_train_batch_size x "
                                "gradient_accumulation_steps x num_processes even",
                                hint="change per_device_train_batch_size or gradient_accumulation_steps")
            merged["num_generations"] = 2
            b.say("num_generations", "converted", f"{self.kind} samples one completion per prompt; grpo samples "
                  "groups of at least 2: generation.num_generations = 2, the same completions a step from half "
                  "the prompts (distill.objective 'reverse_kl' does not compare a group's completions)")

    def rewards(self, b: Any, merged: dict[str, Any]) -> None:
        if merged.get("reward_funcs") or merged.get("reward_model_name_or_path"):
            _rewards(b, merged)
        else:
            b.say("reward_funcs", "default", f"{self.kind} has no reward: the recipe keeps grpo's default "
                  "[[rewards]], scored and logged but not trained on with distill.objective 'reverse_kl'; add "
                  "[[rewards]] that measure the task (e.g. accuracy) to follow what the student learns")

    def write(self, b: Any) -> None:
        """[distill] and a line for each of the config's own fields."""
        _teacher(b, self)
        _objective(b, self)
        if "distill.teacher" not in b.keys:  # no teacher, no [distill]: the lines say why
            b.keys.pop("distill.objective", None)
        for name in ("lmbda", "seq_kd", "loss_top_k", "reverse_kl_top_1_mode", "loss_add_tail", "iw_opd_epsilon",
                     "teacher_model_revision", "teacher_model_init_kwargs", "max_new_tokens"):
            if name in self.own or (name == "lmbda" and "lmbda" in self.defaults):
                _other(b, name, self.value(name), self)


def distillation(fields: dict[str, Any]) -> Distillation | None:
    """The distillation fields of ``fields`` (removed from it, with GRPOConfig's `beta`), or None for a GRPOConfig."""
    if not any(name in fields for name in DISTILL_TYPES):
        return None
    kind, defaults = next((k, d) for k, names, d in KINDS if not names or any(n in fields for n in names))
    own = {name: fields.pop(name) for name in [*DISTILL_TYPES, "beta"] if name in fields}
    if "max_new_tokens" in own and "max_completion_length" not in fields:
        fields["max_completion_length"] = own["max_new_tokens"]
    return Distillation(kind, own, defaults)


def _teacher(b: Any, d: Distillation) -> None:
    urls = d.value("teacher_server_urls")
    if isinstance(urls, str) and urls.strip().startswith("{"):  # TRL reads a dict field's JSON text
        try:
            urls = json.loads(urls)
        except ValueError as err:
            raise UserError(f"teacher_server_urls is {urls!r}: its JSON does not parse: {err}",
                            where="teacher_server_urls", valid="a URL, or a mapping of names to URLs",
                            hint="fix the value in the config") from None
    local, url = d.value("teacher_model_name_or_path"), d.value("teacher_model_server_url")
    served = url if d.kind != "IWOPDConfig" or d.value("use_teacher_server") else None
    if isinstance(urls, dict) and len(urls) > 1:
        b.say("teacher_server_urls", "unsupported", f"{len(urls)} teachers (MOPD): [distill] has one teacher; set "
              "distill.teacher to one of them (" + SERVED + ")")
    elif urls:
        served = next(iter(urls.values())) if isinstance(urls, dict) else urls
    if "use_teacher_server" in d.own:
        b.say("use_teacher_server", "mapped", f"{str(d.own['use_teacher_server']).lower()}: distill.teacher is the "
              + ("server's URL" if served else "local teacher"))
    if served:
        name = "teacher_server_urls" if urls else "teacher_model_server_url"
        b.put(name, "converted", "distill.teacher", served, "the URL must be " + SERVED)
        if local:
            b.say("teacher_model_name_or_path", "ignored", "the teacher is served")
    elif local:
        b.put("teacher_model_name_or_path", "mapped", "distill.teacher", local)
        if url:
            b.say("teacher_model_server_url", "ignored", "use_teacher_server is false: the local teacher is used")
    elif not urls:
        b.say("teacher_model_name_or_path", "unsupported", f"the {d.kind} names no teacher (the script passes it as "
              "a model object?): set distill.teacher to its directory, checkpoint or `grpo ref-serve` URL")


def _objective(b: Any, d: Distillation) -> None:
    beta, gamma = d.value("beta"), d.value("iw_opd_gamma")
    if d.value("distillation_objective") == "iw_opd":
        if "beta" in d.own:
            b.say("beta", "ignored", "unused with distillation_objective 'iw_opd'")
        if gamma == 0:
            b.put("iw_opd_gamma", "mapped", "distill.objective", "reverse_kl", "IW-OPD with gamma 0: advantage = "
                  "teacher - student log-prob of the sampled token, exactly grpo's")
        else:
            b.say("iw_opd_gamma", "unsupported", f"{gamma}: IW-OPD weights each token by 1 + gamma x (the share of "
                  "its completion's |advantage| still ahead); grpo has no such weights: the recipe trains gamma = 0 "
                  "(distill.objective 'reverse_kl')")
        return
    if "iw_opd_gamma" in d.own:
        b.say("iw_opd_gamma", "ignored", "used with distillation_objective 'iw_opd' only")
    if beta == 1.0:
        over = ("the sampled token and a tail bucket (TRL's server trainers)" if "Server" in d.kind or "Async" in d.kind
                else "the whole vocabulary at each position")
        b.put("beta", "converted", "distill.objective", "reverse_kl", f"beta 1.0 is the reverse KL, which TRL takes "
              f"over {over}; grpo's per-token advantage, teacher - student log-prob of the sampled token, has the "
              "gradient of the full reverse KL in expectation")
    else:
        b.say("beta", "unsupported", f"{beta} (TRL's generalized JSD: 0 forward KL, 0.5 JSD, 1 reverse KL) needs the "
              "teacher's whole distribution at each position; grpo's teacher gives the sampled token's log-prob: the "
              "recipe trains the reverse KL (beta 1.0, distill.objective 'reverse_kl')")


def _other(b: Any, name: str, value: Any, d: Distillation) -> None:
    if name == "lmbda":
        given = "" if name in d.own else "TRL's default "
        if value == 1.0:
            b.say(name, "mapped", f"{given}1.0: every completion sampled from the student, as grpo always does")
        else:
            b.say(name, "unsupported", f"{given}{value}: a share {1 - value:g} of the batches would train on the "
                  "dataset's (or, with seq_kd, the teacher's) completions; grpo trains on the student's own samples only")
    elif name == "seq_kd" and value:
        b.say(name, "unsupported", "true: supervised training on the teacher's samples; grpo samples from the student")
    elif name == "loss_top_k" and value != 1 and d.value("distillation_objective") != "iw_opd":
        b.say(name, "unsupported", f"{value}: a divergence over the teacher's top-k tokens; grpo's is the sampled "
              "token's")
    elif name == "reverse_kl_top_1_mode" and value == "argmax":
        b.say(name, "unsupported", "'argmax': grpo scores the sampled token ('sampled')")
    elif name == "loss_add_tail" and value and d.value("distillation_objective") != "iw_opd":
        b.say(name, "ignored", "grpo's signal is the sampled token's log-probs alone, without TRL's tail bucket")
    elif name == "teacher_model_revision" and value:
        b.say(name, "unsupported", f"{value!r}: download it (hf download ID --revision {value} --local-dir DIR) and "
              "set distill.teacher = DIR")
    elif name == "teacher_model_init_kwargs" and value:
        b.say(name, "ignored", f"{value!r}: the teacher loads in model.dtype with [model]'s attn_implementation")
    elif name == "max_new_tokens":
        b.say(name, "mapped", f"GKD's completion length: generation.max_completion_length = {value}")
    elif name == "iw_opd_epsilon":
        b.say(name, "ignored", "IW-OPD's weights' stabilizer (gamma > 0 only)")
    else:
        b.say(name, "mapped", f"{value!r}: nothing to write (grpo does the same)")


__all__ = ["DISTILL_TYPES", "Distillation", "distillation"]
