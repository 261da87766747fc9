"""Rewrite every wheel in a folder with its files stored, not deflated: still the same wheel (RECORD
hashes files' contents, not their compression), but an xz archive of the folder then compresses the
contents themselves (the shared libraries of pyarrow and pandas pack about a third smaller that way).

    python gpu-kit/repack.py WHEELHOUSE
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path


def store(wheel: Path) -> None:
    tmp = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = src.read(info)  # before the entry is marked stored: `info` is the source's own record
            info.compress_type = zipfile.ZIP_STORED
            dst.writestr(info, data)
    tmp.replace(wheel)


if __name__ == "__main__":
    for wheel in sorted(Path(sys.argv[1]).glob("*.whl")):
        store(wheel)
