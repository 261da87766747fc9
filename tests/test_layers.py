"""The layering contract of pyproject.toml ([tool.importlinter]): import-linter checks every
import of grpocli against it (layers point down only; only the command line imports the
trainer; only generation/ and server/ import vllm; the trainer's side, wire/ included, needs no
server package such as fastapi)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cli_runner import ROOT


def test_imports_follow_the_layering_contract():
    lint = Path(sys.executable).parent / "lint-imports"  # import-linter, from the dev extra
    assert lint.exists(), "import-linter is not installed: pip install -e '.[dev]'"
    out = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "4 kept, 0 broken" in out.stdout


# --- the map of the code: package docstrings and docs/code.md say what is there -------------------
import ast  # noqa: E402
import re  # noqa: E402

import tomllib  # noqa: E402

PACKAGE = ROOT / "grpocli"
MODULE_NAME = re.compile(r"(?<![\w/.])(\w+)\.py\b")


def contract_layers() -> list[set[str]]:
    """The layers of pyproject.toml's "layers" contract, top to bottom, each a set of names."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    contract = next(c for c in config["contracts"] if c["type"] == "layers")
    return [{name.strip() for name in layer.split("|")} for layer in contract["layers"]]


def packages() -> list[Path]:
    return sorted(p.parent for p in PACKAGE.glob("*/__init__.py"))


def test_every_package_docstring_lists_exactly_its_modules():
    wrong = []
    for package in packages():
        doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
        listed = set(MODULE_NAME.findall(doc)) - {"__init__"}
        there = {p.stem for p in package.glob("*.py")} - {"__init__"}
        if listed != there:
            wrong.append(f"grpocli/{package.name}/__init__.py: not listed {sorted(there - listed)}, "
                         f"listed but absent {sorted(listed - there)}")
    assert not wrong, "\n".join(wrong)


def code_md_layers() -> list[set[str]]:
    """docs/code.md's layer table, top to bottom: the `names` in its first column, one set per row."""
    text = (ROOT / "docs" / "code.md").read_text()
    table = text.split("<!-- layers -->", 2)[1]
    rows = [line for line in table.splitlines() if line.startswith("|") and "`" in line.split("|")[1]]
    return [set(re.findall(r"`(\w+)(?:/|\.py)?`", row.split("|")[1])) for row in rows]


def test_code_md_lists_the_contract_layers_in_order():
    assert code_md_layers() == contract_layers()


def test_the_contract_names_every_package_and_module_once():
    named = [name for layer in contract_layers() for name in layer]
    there = {p.name for p in packages()} | {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    assert sorted(named) == sorted(there)


def test_each_only_contract_forbids_every_other_package():
    """"Only A and B import X": every package and top-level module but A, B (and X's own) is a source."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    allowed = {"grpocli.trainer": {"cli", "benchmark", "trainer"}, "vllm": {"generation", "server"}}
    every = {p.name for p in packages()} | {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    for contract in config["contracts"]:
        forbidden = contract.get("forbidden_modules", [])
        if contract["name"].startswith("Only") and forbidden:
            sources = {m.removeprefix("grpocli.") for m in contract["source_modules"]}
            assert sources == every - allowed[forbidden[0]], contract["name"]


def test_no_module_imports_one_that_imports_it_back():
    """No file circle anywhere in grpocli: modules import each other one way, at the top or inside
    functions alike (grimp sees both). Package __init__ modules are left out: they re-export their
    modules' names, so every module of a package that imports a sibling through it would count."""
    import grimp

    graph = grimp.build_graph("grpocli", exclude_type_checking_imports=True)  # those never run
    modules = {m for m in graph.modules if not graph.find_children(m)}
    assert {"grpocli.parallel.adapters", "grpocli.server.guard", "grpocli.trainer.loop"} <= modules
    edges = {a: {b for b in graph.find_modules_directly_imported_by(a) if b in modules} for a in modules}
    circles = []
    for start in sorted(modules):  # a module that reaches itself again through the others
        seen, todo = set(), list(edges[start])
        while todo:
            m = todo.pop()
            if m == start:
                circles.append(start)
                break
            if m not in seen:
                seen.add(m)
                todo.extend(edges[m])
    assert circles == []
