"""The layering contract of pyproject.toml ([tool.importlinter]): import-linter checks every
import of grpocli against it (layers point down only; only the command line imports the
trainer; only generation/ and server/ import vllm)."""

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
    assert "3 kept, 0 broken" in out.stdout


def test_no_module_of_the_parallel_package_imports_one_that_imports_it_back():
    """grpocli.parallel's modules import each other one way (fsdp2 -> adapters, not back), at the top
    or inside functions alike (grimp sees both)."""
    import grimp

    graph = grimp.build_graph("grpocli")
    modules = sorted(m for m in graph.modules if m.startswith("grpocli.parallel."))
    assert "grpocli.parallel.adapters" in modules and "grpocli.parallel.fsdp2" in modules
    circles = [(a, graph.find_shortest_chain(b, a)) for a in modules for b in graph.find_modules_directly_imported_by(a)
               if b.startswith("grpocli.") and graph.find_shortest_chain(b, a)]
    assert circles == []
