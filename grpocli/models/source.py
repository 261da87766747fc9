"""Where a model or tokenizer comes from: a local directory or a hub id, checked before loading.

transformers' ``from_pretrained`` retries an unreachable hub for a minute or more per file and
then raises an OSError about internet connections; this module answers in well under a second
with a UserError that says what was looked for, what is valid and what to run next:

* an existing directory is used as it is (it must hold ``config.json`` for a model);
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


@dataclass(frozen=True)
class Source:
    """A checked place to load from: ``path`` is a directory or hub id for ``from_pretrained``."""

    path: str
    local_files_only: bool


def offline() -> bool:
    """True when HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set to a true value now."""
    flags = (os.environ.get(v, "") for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    return any(f.strip().lower() in {"1", "true", "yes", "on"} for f in flags)


#: Files that mark a directory (or cached hub repo) as holding a model / a tokenizer.
MARKERS = {
    "model": ("config.json",),
    "tokenizer": ("tokenizer_config.json", "tokenizer.json"),
}


def resolve(name: str, *, key: str, what: str = "model") -> Source:
    """Check that ``name``, a directory or hub id, holds a ``what`` ("model" or "tokenizer").

    ``key`` is the dotted recipe key that named it, for the error.
    """
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    markers = MARKERS[what]
    path = os.path.expanduser(name)
    if os.path.isdir(path):
        if not any(os.path.isfile(os.path.join(path, m)) for m in markers):
            other = ""
            if what == "tokenizer" and key != "model.tokenizer":
                other = " (or set model.tokenizer)"
            raise UserError(
                f"{path} has no {' or '.join(markers)}, so it holds no saved {what}",
                where=key,
                valid="a directory written by save_pretrained (config.json, *.safetensors, "
                "tokenizer files) or a hub id such as Qwen/Qwen2.5-0.5B-Instruct",
                hint=f"point {key} at the directory that holds {markers[0]}{other}",
            )
        return Source(path, local_files_only=True)
    try:
        validate_repo_id(name)
    except HFValidationError:
        where_not = "" if os.path.isabs(path) else f" ({os.path.abspath(path)} does not exist)"
        raise UserError(
            f"no {what} at {path}{where_not}",
            where=key,
            valid=f"a local directory with {markers[0]}, a reachable hub id (org/name) or 'tiny'",
            hint=_DOWNLOAD_HINT.format(id="ORG/NAME", key=key),
        ) from None
    return _hub(name, key=key, markers=markers)


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
