"""The child process of `grpo import trl SCRIPT.py`: runs a TRL training script as `python SCRIPT.py ARGS`
would (``__name__ == "__main__"``, ``sys.argv`` = the script and its arguments), with stand-ins for what
would load, download or train, and writes what the script built to a JSON file.

    python -m grpocli.recipe.trl_script_run RESULT.json SCRIPT.py [ARGS...]

What runs for real: the script's own code, TRL's and transformers' argument parsers (HfArgumentParser,
TrlParser with ``--config x.yaml``), GRPOConfig (its device check told this is a CPU), peft's LoraConfig.
What is a stand-in, recording its arguments:
  - ``GRPOTrainer`` (trl, trl.trainer, trl.trainer.grpo_trainer): records model, reward_funcs, args,
    datasets and peft_config; ``train()``, ``save_model()``, ``push_to_hub()``... do nothing; so does
    ``DistillationTrainer`` (its teacher_model too), whose DistillationConfig is recorded as GRPOConfig is;
  - ``datasets.load_dataset``: a recorded name, config and split; ``map``, ``filter``... are noted, not run;
  - ``from_pretrained`` of transformers' Auto classes and models: a recorded name and keyword arguments;
  - ``peft.get_peft_model``: the model, with its LoraConfig noted.
The process has the hub's offline variables set and every socket connection to a host other than
127.0.0.1/::1 refused, so nothing in the script reaches the network.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import json
import os
import runpy
import socket
import sys
from typing import Any

RECORD: dict[str, Any] = {"configs": [], "parsed": [], "trainers": [], "notes": []}
LOOPBACK = ("127.0.0.1", "::1", "localhost")
LORA = ("r", "lora_alpha", "lora_dropout", "target_modules")


class Anything:
    """What a stand-in returns: any attribute, call, item or iteration works (and does nothing)."""

    def __init__(self, label: str = "object") -> None:
        object.__setattr__(self, "_label", label)

    def __getattr__(self, name: str) -> Anything:
        if name.startswith("__"):
            raise AttributeError(name)
        return Anything(f"{self._label}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> Anything:
        return Anything(f"{self._label}()")

    def __getitem__(self, key: Any) -> Anything:
        return Anything(f"{self._label}[{key!r}]")

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def __iter__(self):
        return iter(())

    def __len__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return f"<{self._label}>"


class ScriptModel(Anything):
    """A model or tokenizer the script would have loaded."""

    def __init__(self, name: str, kwargs: dict[str, Any], kind: str) -> None:
        super().__init__(f"{kind}({name!r})")
        object.__setattr__(self, "record", {"name": name, "kwargs": plain(kwargs), "kind": kind})
        object.__setattr__(self, "name_or_path", name)


class ScriptDataset(Anything):
    """A dataset the script would have downloaded: its name, config and split, and what was asked of it."""

    def __init__(self, record: dict[str, Any]) -> None:
        super().__init__(f"dataset({record.get('path')!r})")
        object.__setattr__(self, "record", record)
        object.__setattr__(self, "column_names", [])

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)

        def noted(*args: Any, **kwargs: Any) -> ScriptDataset:
            fn = args[0] if args and callable(args[0]) else kwargs.get("function")
            what = f"{name}({getattr(fn, '__name__', '')})"
            return ScriptDataset({**self.record, "ops": [*self.record.get("ops", []), what]})
        return noted

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str) and self.record.get("split") is None:
            return ScriptDataset({**self.record, "split": key})
        return Anything(f"{self._label}[{key!r}]")

    def train_test_split(self, *args: Any, **kwargs: Any) -> dict[str, ScriptDataset]:
        ops = [*self.record.get("ops", []), "train_test_split"]
        return {s: ScriptDataset({**self.record, "ops": ops, "part": s}) for s in ("train", "test")}


def plain(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON can hold it (an enum by its value, anything else unknown by its repr)."""
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if depth < 6 and isinstance(value, dict):
        return {str(k): plain(v, depth + 1) for k, v in value.items()}
    if depth < 6 and isinstance(value, (list, tuple, set)):
        return [plain(v, depth + 1) for v in value]
    return {"__repr__": repr(value)[:200]}


def set_fields(obj: Any) -> dict[str, Any]:
    """The dataclass fields of ``obj`` whose values differ from their defaults."""
    out = {}
    for f in dataclasses.fields(obj):
        if not f.init:
            continue
        if f.name in own_fields(type(obj)):  # a field the script's own class adds: its default is the script's
            out[f.name] = plain(getattr(obj, f.name, None))
            continue
        default = (f.default if f.default is not dataclasses.MISSING else f.default_factory()
                   if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
        value = getattr(obj, f.name, None)
        if default is dataclasses.MISSING or not _same(plain(value), plain(default)):
            out[f.name] = plain(value)
    return out


def own_fields(cls: type) -> set[str]:
    """The dataclass fields that classes outside TRL, transformers and peft add (open-r1's GRPOScriptArguments)."""
    library = ("trl", "transformers", "peft", "dataclasses")
    theirs = set()
    for base in cls.__mro__:
        if base.__module__.split(".")[0] in library and dataclasses.is_dataclass(base):
            theirs |= {f.name for f in dataclasses.fields(base)}
    return {f.name for f in dataclasses.fields(cls)} - theirs


def _same(value: Any, default: Any) -> bool:
    """Equal, or both "off" (a parser gives None for a default "", False for a default "no"); a False or None
    against a default None stays set (bf16=False is not GRPOConfig's bf16=None, which means true)."""
    return value == default or (not value and default in ("", "no", [], ()))


def describe(value: Any) -> Any:
    """A trainer argument as the importer reads it."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return [describe(v) for v in value]
    if isinstance(value, (ScriptModel, ScriptDataset)):
        return value.record
    if isinstance(value, functools.partial):
        return {**describe(value.func), "kwargs": plain(value.keywords)}
    if inspect.isfunction(value) or inspect.ismethod(value) or inspect.isbuiltin(value):
        return {"function": value.__qualname__, "module": value.__module__,
                "file": inspect.getsourcefile(value) if inspect.isfunction(value) else None}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = set_fields(value)
        if hasattr(value, "lora_alpha"):  # a LoraConfig: its rank and the rest, defaults or not
            fields.update({k: plain(getattr(value, k, None)) for k in LORA})
        return {"class": type(value).__name__, "fields": fields, "id": id(value)}
    config = getattr(value, "config", None)
    if config is not None and getattr(config, "_name_or_path", None):  # a model the script built itself
        return {"name": config._name_or_path, "kwargs": {}, "kind": type(value).__name__}
    try:
        rows = len(value)
    except TypeError:
        rows = None
    return {"object": type(value).__name__, "rows": rows, "columns": plain(getattr(value, "column_names", None))}


def install() -> None:
    """Put the stand-ins in place (this process only)."""
    _refuse_the_network()
    _record_grpo_configs()
    _record_parsers()
    _stand_in_trainer()
    _stand_in_loaders()


def _refuse_the_network() -> None:
    connect = socket.socket.connect

    def local_only(self: socket.socket, address: Any) -> Any:
        host = address[0] if isinstance(address, tuple) else address
        if self.family in (socket.AF_INET, socket.AF_INET6) and host not in LOOPBACK:
            raise OSError(f"grpo import trl: the script tried to reach {host} (the network is off while it is read)")
        return connect(self, address)
    socket.socket.connect = local_only  # type: ignore[method-assign]


def _record_grpo_configs() -> None:
    from trl.trainer.distillation_config import DistillationConfig
    from trl.trainer.grpo_config import GRPOConfig

    for config in (GRPOConfig, DistillationConfig):  # subclasses (open-r1's GRPOConfig) call them too
        config.__post_init__ = _recorded(config.__post_init__)


def _recorded(post_init: Any) -> Any:
    def recorded(self: Any) -> None:
        RECORD["configs"].append({"class": type(self).__name__, "fields": set_fields(self), "id": id(self)})
        asked = self.use_cpu
        self.use_cpu = True  # TrainingArguments refuses bf16 (TRL's default) on a machine without a GPU
        try:
            post_init(self)
        finally:
            self.use_cpu = asked
    return recorded


def _record_parsers() -> None:
    from transformers import HfArgumentParser
    from trl.trainer.distillation_config import DistillationConfig
    from trl.trainer.grpo_config import GRPOConfig

    def wrap(method: Any) -> Any:
        @functools.wraps(method)
        def parsed(self: Any, *args: Any, **kwargs: Any) -> Any:
            out = method(self, *args, **kwargs)
            for obj in out if isinstance(out, tuple) else (out,):
                if dataclasses.is_dataclass(obj) and not isinstance(obj, (type, GRPOConfig, DistillationConfig)):
                    RECORD["parsed"].append({"class": type(obj).__name__, "fields": set_fields(obj)})
            return out
        return parsed
    parsers = [HfArgumentParser]
    try:
        from trl.scripts._hf_argparser import HfArgumentParser as TrlCopy  # TRL 1.x parses with its own copy

        parsers.append(TrlCopy)
    except ImportError:
        pass
    for parser in parsers:
        for name in ("parse_args_into_dataclasses", "parse_dict", "parse_json_file", "parse_yaml_file"):
            if name in vars(parser):
                setattr(parser, name, wrap(vars(parser)[name]))


class ScriptTrainer(Anything):
    """GRPOTrainer's stand-in: records its arguments; train() and the rest do nothing."""

    signature = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__("trainer")
        bound = self.signature.bind_partial(None, *args, **kwargs).arguments if self.signature else kwargs
        RECORD["trainers"].append({k: describe(v) for k, v in bound.items() if k != "self" and v is not None})


def _stand_in_trainer() -> None:
    import trl
    import trl.trainer
    from trl.trainer import distillation_trainer, grpo_trainer

    ScriptTrainer.signature = inspect.signature(grpo_trainer.GRPOTrainer.__init__)
    for home in (trl, trl.trainer, grpo_trainer):
        home.GRPOTrainer = ScriptTrainer
    ScriptDistillationTrainer.signature = inspect.signature(distillation_trainer.DistillationTrainer.__init__)
    for home in (trl, trl.trainer, distillation_trainer):
        home.DistillationTrainer = ScriptDistillationTrainer


class ScriptDistillationTrainer(ScriptTrainer):
    """DistillationTrainer's stand-in (its arguments: the model, teacher_model, args, datasets, peft_config)."""


def _stand_in_loaders() -> None:
    import datasets
    import transformers
    from transformers.models.auto.auto_factory import _BaseAutoModelClass

    def load_dataset(path: Any = None, name: Any = None, *args: Any, **kwargs: Any) -> ScriptDataset:
        record = {"path": path, "name": name, "split": kwargs.get("split"),
                  "data_files": plain(kwargs.get("data_files")), "data_dir": kwargs.get("data_dir")}
        return ScriptDataset(record)
    datasets.load_dataset = load_dataset

    def loader(kind: str) -> Any:
        def from_pretrained(cls: Any, name: Any = None, *args: Any, **kwargs: Any) -> ScriptModel:
            return ScriptModel(str(name), kwargs, f"{kind}:{getattr(cls, '__name__', cls)}")
        return classmethod(from_pretrained)
    _BaseAutoModelClass.from_pretrained = loader("model")
    transformers.PreTrainedModel.from_pretrained = loader("model")
    for name in [n for n in dir(transformers) if n.startswith("Auto")]:  # some define their own
        cls = getattr(transformers, name, None)
        if isinstance(cls, type) and "from_pretrained" in vars(cls):
            setattr(cls, "from_pretrained", loader("model" if name.startswith("AutoModel") else name))
    try:
        import peft
    except ImportError:
        return

    def get_peft_model(model: Any, config: Any, *args: Any, **kwargs: Any) -> Any:
        RECORD["notes"].append({"peft_config": describe(config)})
        return model
    peft.get_peft_model = get_peft_model


def main(argv: list[str]) -> int:
    out, script, *args = argv
    install()
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as `python SCRIPT.py` puts it first
    error = None
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            error = f"the script called sys.exit({exc.code!r})"
    except BaseException as exc:  # noqa: BLE001 - said to the user by the parent, with the line
        frames = [f for f in inspect.trace() if f.filename == str(script) or f.filename.endswith(script)]
        at = f" at line {frames[-1].lineno}" if frames else ""
        error = f"{type(exc).__name__}{at}: {exc}"
    RECORD["error"] = error
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(RECORD, fh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
