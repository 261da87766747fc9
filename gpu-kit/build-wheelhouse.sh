#!/usr/bin/env bash
# Build the GPU acceptance kit (README, "The GPU acceptance kit"), on a machine with PyPI and this
# checkout's environment (grpocli installed with its bench extra, and pytest: the list of wheels
# is read from it, gpu-kit/wheel_list.py):
#
#   gpu-kit/build-wheelhouse.sh [--no-download] [OUT_DIR]     # OUT_DIR: gpu-kit/dist/grpo-gpu-kit
#
# OUT_DIR gets wheelhouse.tar.xz (grpocli's wheel, built here, and the wheels a node with torch,
# transformers, accelerate and peft lacks, each stored uncompressed so that xz packs their
# contents; it must stay within 60 MB), the tests, pyproject.toml (pytest's markers), run.sh and
# summary.py; OUT_DIR.tar is that folder, to carry to the node. --no-download: grpocli's wheel only.
# A node with another Python: KIT_PYTHON_VERSION=3.10 (and KIT_PLATFORM=manylinux_2_28_x86_64).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
PY=${PYTHON:-python3}
LIMIT_MB=60
DOWNLOAD=1
if [ "${1:-}" = "--no-download" ]; then DOWNLOAD=0; shift; fi
OUT=${1:-$HERE/dist/grpo-gpu-kit}
rm -rf "$OUT" "$OUT.tar"
mkdir -p "$OUT/wheelhouse"
"$PY" -m pip wheel -q --no-deps --no-build-isolation --disable-pip-version-check -w "$OUT/wheelhouse" "$ROOT"
if [ $DOWNLOAD = 1 ]; then
    "$PY" "$HERE/wheel_list.py" > "$OUT/requirements.txt"
    TARGET=()
    [ -n "${KIT_PYTHON_VERSION:-}" ] && TARGET+=(--python-version "$KIT_PYTHON_VERSION")
    [ -n "${KIT_PLATFORM:-}" ] && TARGET+=(--platform "$KIT_PLATFORM")
    "$PY" -m pip download -q --no-deps --only-binary=:all: --disable-pip-version-check "${TARGET[@]}" \
        -d "$OUT/wheelhouse" -r "$OUT/requirements.txt"
fi
"$PY" "$HERE/repack.py" "$OUT/wheelhouse"
XZ_OPT=${XZ_OPT:--9 -T0} tar -cJf "$OUT/wheelhouse.tar.xz" -C "$OUT" wheelhouse
rm -rf "$OUT/wheelhouse"
(cd "$ROOT" && tar -cf - --exclude=__pycache__ tests pyproject.toml) | tar -xf - -C "$OUT"
cp "$HERE/run.sh" "$HERE/summary.py" "$OUT/"
tar -cf "$OUT.tar" -C "$(dirname "$OUT")" "$(basename "$OUT")"
BYTES=$(stat -c %s "$OUT/wheelhouse.tar.xz")
echo "wheelhouse: $(ls "$OUT/requirements.txt" > /dev/null 2>&1 && wc -l < "$OUT/requirements.txt" || echo 0) downloaded wheels + grpocli;" \
     "wheelhouse.tar.xz $(awk "BEGIN {printf \"%.1f\", $BYTES / 1e6}") MB (limit $LIMIT_MB MB); kit $OUT.tar" \
     "$(awk "BEGIN {printf \"%.1f\", $(stat -c %s "$OUT.tar") / 1e6}") MB"
if [ "$BYTES" -gt $((LIMIT_MB * 1000000)) ]; then
    echo "error: the wheelhouse is over $LIMIT_MB MB" >&2
    exit 1
fi
