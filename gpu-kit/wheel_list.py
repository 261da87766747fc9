"""Print the pinned requirements the GPU kit's wheelhouse holds: every distribution that grpocli
(with its `bench` extra: TRL) and pytest need, as installed in this environment, minus what a
cluster node that already has torch, transformers, accelerate and peft has (those four and
everything they depend on). grpocli's own light dependencies (typer, rich, pydantic, ...) and
theirs are listed even where this environment's transformers brings them (older transformers
releases do not), unless torch needs them. One `name==version` a line; grpocli itself is built
from the checkout.

    python gpu-kit/wheel_list.py [--node torch,transformers,accelerate,peft]
"""

from __future__ import annotations

import argparse
import re
from importlib import metadata

from packaging.requirements import Requirement

#: grpocli's dependencies that a node's transformers may or may not bring (small wheels).
LIGHT = ["typer", "rich", "pydantic", "pydantic-settings", "pluggy", "safetensors", "tomli-w"]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(roots: list[str]) -> dict[str, str]:
    """{canonical name: installed version} of `roots` ("name" or "name[extra,...]") and everything
    they require here (environment markers evaluated, extras followed)."""
    seen: dict[str, str] = {}
    todo = [Requirement(r) for r in roots]
    while todo:
        req = todo.pop()
        name = canonical(req.name)
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            continue  # an optional dependency that is not installed here: not needed
        first = name not in seen
        seen[name] = dist.version
        for text in dist.requires or []:
            sub = Requirement(text)
            if sub.marker is not None:
                envs = [{"extra": e} for e in (req.extras or {""})]
                if not any(sub.marker.evaluate(env) for env in envs):
                    continue
            if first or req.extras:
                todo.append(sub)
    return seen


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--node", default="torch,transformers,accelerate,peft",
                   help="what the node has installed (comma-separated)")
    a = p.parse_args()
    need = closure(["grpocli[bench]", "pytest"])
    have = closure(a.node.split(","))
    light = closure(LIGHT)
    for name in sorted((set(need) - set(have) | set(light) - set(closure(["torch"]))) - {"grpocli"}):
        print(f"{name}=={need.get(name) or light[name]}")


if __name__ == "__main__":
    main()
