"""Where a model or tokenizer comes from: a local directory, a GGUF file, a packaged model or a hub
id, checked before loading.

transformers' ``from_pretrained`` retries an unreachable hub for a minute or more per file and
then raises an OSError about internet connections; this module answers in well under a second
with a UserError that says what was looked for, what is valid and what to run next:

* a packaged model (``"smollm2-135m-instruct"``, ``"pkg:MODULE[/PATH]"``; grpocli.models.packaged)
  is the .gguf file shipped in an installed Python package;
* a ``.gguf`` file, or a directory that holds exactly one ``.gguf`` file and no saved model
  (``config.json``) / tokenizer files, is loaded through transformers' GGUF support
  (``from_pretrained(directory, gguf_file=name)``; needs the ``gguf`` package: ``grpocli[gguf]``);
* another existing directory is used as it is (it must hold ``config.json`` for a model);
* anything else that is not a valid hub id (``./x``, ``/abs/x``, ``a/b/c``) is a missing path;
* a hub id is used from the local cache when ``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE`` is set
  (read at call time) or the hub cannot be reached, and fetched otherwise.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from grpocli.errors import UserError

_DOWNLOAD_HINT = (
    "on a machine with access run `hf download {id} --local-dir DIR` (`huggingface-cli "
    "download` in older huggingface_hub) or save_pretrained(DIR), copy DIR here and set "
    "{key} = \"DIR\""
)


#: The oldest gguf package transformers' GGUF loader accepts (transformers' GGUF_MIN_VERSION).
GGUF_MIN_VERSION = "0.10.0"
GGUF_SUFFIX = ".gguf"


@dataclass(frozen=True)
class Source:
    """A checked place to load from: ``path`` is a directory or hub id for ``from_pretrained``.

    ``gguf_file`` is set for a GGUF model: the file's name inside the directory ``path``, to pass
    as ``from_pretrained(path, gguf_file=gguf_file)``.
    """

    path: str
    local_files_only: bool
    gguf_file: str | None = None


def offline() -> bool:
    """True when HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set to a true value now."""
    flags = (os.environ.get(v, "") for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    return any(f.strip().lower() in {"1", "true", "yes", "on"} for f in flags)


#: Files that mark a directory (or cached hub repo) as holding a model / a tokenizer.
MARKERS = {
    "model": ("config.json",),
    "tokenizer": ("tokenizer_config.json", "tokenizer.json"),
}


def resolve(name: str, *, key: str, what: str = "model", gguf: bool = False, hub: bool = True) -> Source:
    """Check that ``name`` holds a ``what`` ("model" or "tokenizer"), without loading anything.

    ``name`` is a directory, a hub id, or (with ``gguf=True``, for callers that load through
    grpocli.models.loader) a .gguf file, a directory holding one, or a packaged model name.
    ``key`` is the dotted recipe key that named it, for the error. ``hub=False`` checks a hub id's
    spelling only (no cache lookup, no request).
    """
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    from grpocli.models import packaged

    markers = MARKERS[what]
    path = os.path.expanduser(name)
    if not os.path.exists(path) and packaged.is_packaged(name):
        path = packaged.locate(name, key=key)
        if os.path.isdir(path):
            return _checked_gguf(_single_gguf(path, key=key, what=what, named=name), key, gguf)
    if os.path.isfile(path):
        if not path.lower().endswith(GGUF_SUFFIX):
            raise UserError(
                f"{path} is a file, not a directory or a {GGUF_SUFFIX} file",
                where=key,
                valid=f"a directory written by save_pretrained, a {GGUF_SUFFIX} file, a folder holding "
                "one, or a hub id",
                hint=f"point {key} at the directory that holds the model's {markers[0]}",
            )
        return _checked_gguf(path, key, gguf)
    if os.path.isdir(path):
        if not any(os.path.isfile(os.path.join(path, m)) for m in markers):
            return _checked_gguf(_single_gguf(path, key=key, what=what), key, gguf)
        return Source(path, local_files_only=True)
    if path.lower().endswith(GGUF_SUFFIX):
        raise UserError(
            f"no GGUF file at {path}" + ("" if os.path.isabs(path) else f" ({os.path.abspath(path)})"),
            where=key,
            valid=f"an existing {GGUF_SUFFIX} file or a folder holding one",
            hint="check the path; GGUF files of hub models can be fetched with `hf download ORG/NAME "
            "FILE.gguf --local-dir DIR`",
        )
    try:
        validate_repo_id(name)
    except HFValidationError:
        where_not = "" if os.path.isabs(path) else f" ({os.path.abspath(path)} does not exist)"
        raise UserError(
            f"no {what} at {path}{where_not}",
            where=key,
            valid=f"a local directory with {markers[0]}, a reachable hub id (org/name), 'tiny'"
            + (f", a {GGUF_SUFFIX} file or a packaged model ({', '.join(packaged.PACKAGED)})" if gguf else ""),
            hint=_DOWNLOAD_HINT.format(id="ORG/NAME", key=key),
        ) from None
    if gguf and "/" not in name and packaged.unknown_hint(name):
        raise UserError(
            f"no {what} at {path}, and {name!r} is not a packaged model{packaged.unknown_hint(name)}",
            where=key,
            valid=f"a packaged model ({', '.join(packaged.PACKAGED)}), a local path or a hub id org/name",
        )
    if not hub:
        return Source(name, local_files_only=offline())
    return _hub(name, key=key, markers=markers)


def gguf_problem() -> str | None:
    """Why transformers cannot load GGUF files here (the gguf package missing or too old), or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("gguf")
    except PackageNotFoundError:
        return "the gguf package, which transformers needs to read GGUF files, is not installed"
    from packaging.version import InvalidVersion, Version

    try:
        old = Version(found) < Version(GGUF_MIN_VERSION)
    except InvalidVersion:
        return None
    if old:
        return f"gguf {found} is installed; transformers needs gguf >= {GGUF_MIN_VERSION} to read GGUF files"
    return None


def _single_gguf(directory: str, *, key: str, what: str, named: str | None = None) -> str:
    """The one .gguf file in ``directory``; UserError when there is none or several.

    ``named``: the packaged-model name (``pkg:MODULE``) that stands for ``directory``, for the hint.
    """
    markers = MARKERS[what]
    found = sorted(f for f in os.listdir(directory) if f.lower().endswith(GGUF_SUFFIX))
    if len(found) == 1:
        return os.path.join(directory, found[0])
    if found:
        raise UserError(
            f"{directory} holds {len(found)} GGUF files ({', '.join(found)}), so which model to load "
            "is ambiguous",
            where=key,
            valid=f"a {GGUF_SUFFIX} file, or a folder holding exactly one",
            hint=f"point {key} at one of them, e.g. {key} = \"{os.path.join(directory, found[0])}\""
            if not named else f"name one file: {key} = \"{named.rstrip('/')}/{found[0]}\"",
        )
    other = ""
    if what == "tokenizer" and key != "model.tokenizer":
        other = " (or set model.tokenizer)"
    raise UserError(
        f"{directory} has no {' or '.join(markers)} and no {GGUF_SUFFIX} file, so it holds no saved {what}",
        where=key,
        valid="a directory written by save_pretrained (config.json, *.safetensors, tokenizer files), "
        f"a {GGUF_SUFFIX} file or a folder holding one, or a hub id such as Qwen/Qwen2.5-0.5B-Instruct",
        hint=f"point {key} at the directory that holds {markers[0]}{other}",
    )


def _checked_gguf(file: str, key: str, allowed: bool) -> Source:
    """The Source of the GGUF ``file``, once this caller accepts GGUF and the gguf package is here."""
    if not allowed:
        raise UserError(
            f"{file} is a GGUF model, which {key} does not accept",
            where=key,
            valid="a directory written by save_pretrained, or a hub id",
            hint="train or evaluate from the GGUF file (model.name_or_path accepts it) and use a "
            "checkpoint that run writes (ordinary safetensors)",
        )
    problem = gguf_problem()
    if problem:
        raise UserError(
            f"{file} is a GGUF model, but {problem}",
            where=key,
            valid="the gguf package >= " + GGUF_MIN_VERSION,
            hint="pip install 'grpocli[gguf]'",
        )
    file = os.path.abspath(file)
    return Source(os.path.dirname(file), local_files_only=True, gguf_file=os.path.basename(file))


def _hub(repo_id: str, *, key: str, markers: tuple[str, ...]) -> Source:
    """A hub id: from the cache when offline or unreachable, else checked with one quick request."""
    from huggingface_hub import HfApi, try_to_load_from_cache
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    cached = any(isinstance(try_to_load_from_cache(repo_id, m), str) for m in markers)
    unreachable = UserError(
        f"hub id {repo_id} could not be fetched (offline?) and is not in the local cache"
        + (" (HF_HUB_OFFLINE is set)" if offline() else ""),
        where=key,
        valid=f"a local directory with {markers[0]} or a reachable hub id "
        f"(no local directory ./{repo_id} exists either)",
        hint=_DOWNLOAD_HINT.format(id=repo_id, key=key),
    )
    if offline():
        if cached:
            return Source(repo_id, local_files_only=True)
        raise unreachable
    try:
        HfApi().model_info(repo_id, timeout=10)
    except (RepositoryNotFoundError, GatedRepoError) as err:
        if cached:
            return Source(repo_id, local_files_only=True)
        raise UserError(
            f"hub id {repo_id} does not exist, or is private or gated ({type(err).__name__})",
            where=key,
            valid="a public hub id such as Qwen/Qwen2.5-0.5B-Instruct, or a local directory",
            hint="check the spelling; for a private or gated model run `hf auth login`",
        ) from None
    except Exception:  # noqa: BLE001 - any transport failure means "cannot reach the hub"
        if cached:
            return Source(repo_id, local_files_only=True)
        raise unreachable from None
    return Source(repo_id, local_files_only=False)
