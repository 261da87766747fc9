#!/usr/bin/env bash
# The GPU acceptance kit, run on a bare CUDA node (no network) that has torch, transformers,
# accelerate and peft: installs grpo from ./wheelhouse, runs the `gpu`/`gpu2` tests, `grpo plan`
# (where this grpo has it) and `grpo bench` (alone, and --vs-trl against TRL) on models built from a
# config at Qwen2.5-0.5B and 1.5B shapes (random weights, every completion forced to the full
# length); each step under `timeout 600`; prints ONE JSON line with every figure at the end
# (also written to results/kit.json). Build the kit first: gpu-kit/build-wheelhouse.sh (README).
#
#   ./run.sh                          # into the current Python environment
#   KIT_VENV=/tmp/kit-venv ./run.sh   # into a new venv that sees the system's packages
#
# Settings (environment): PYTHON (default python3), KIT_SHAPES ("qwen2.5-0.5b qwen2.5-1.5b"),
# KIT_RECIPE (quickstart), KIT_DTYPE (bfloat16), KIT_BACKEND (auto: vLLM where installed, else hf),
# KIT_LENGTH (256 completion tokens), KIT_STEPS (4), KIT_REPEATS (1 trial per framework),
# KIT_STEP_TIMEOUT (600 s), KIT_OUT (./results), KIT_SKIP ("" or any of: install tests plan bench vs-trl).
set -u
KIT=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python3}
OUT=${KIT_OUT:-$KIT/results}
SHAPES=${KIT_SHAPES:-qwen2.5-0.5b qwen2.5-1.5b}
RECIPE=${KIT_RECIPE:-quickstart}
DTYPE=${KIT_DTYPE:-bfloat16}
BACKEND=${KIT_BACKEND:-auto}
if [ "$BACKEND" = auto ]; then  # vLLM where installed, else hf: grpo's own "auto" picks paged there,
    "$PY" -c "import vllm" > /dev/null 2>&1 && BACKEND=vllm || BACKEND=hf  # which cannot force lengths
fi
LENGTH=${KIT_LENGTH:-256}
STEPS=${KIT_STEPS:-4}
REPEATS=${KIT_REPEATS:-1}
LIMIT=${KIT_STEP_TIMEOUT:-600}
SKIP=" ${KIT_SKIP:-} "
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
mkdir -p "$OUT"
: > "$OUT/steps.jsonl"

# step NAME OUTFILE CMD...: run CMD under timeout, its stdout to OUTFILE, stderr to NAME.log; one line to steps.jsonl
step() {
    local name=$1 outfile=$2; shift 2
    local t0 rc
    t0=$(date +%s.%N)
    echo "== $name: $*" >&2
    timeout "$LIMIT" "$@" > "$outfile" 2> "$OUT/$name.log"
    rc=$?
    printf '{"step": "%s", "rc": %d, "seconds": %.1f}\n' "$name" "$rc" "$(awk "BEGIN {print $(date +%s.%N) - $t0}")" >> "$OUT/steps.jsonl"
    [ $rc -eq 0 ] || { echo "   $name failed (exit $rc; 124 = past ${LIMIT} s): tail of $OUT/$name.log:" >&2; tail -5 "$OUT/$name.log" >&2; }
    return $rc
}
skipped() { case "$SKIP" in *" $1 "*) return 0;; esac; return 1; }

if ! skipped install; then
    if [ -n "${KIT_VENV:-}" ]; then
        "$PY" -m venv --system-site-packages "$KIT_VENV" && PY=$KIT_VENV/bin/python
    fi
    if [ ! -d "$KIT/wheelhouse" ] && [ -f "$KIT/wheelhouse.tar.xz" ]; then
        tar -xJf "$KIT/wheelhouse.tar.xz" -C "$KIT"
    fi
    step install "$OUT/install.out" "$PY" -m pip install --no-index --find-links "$KIT/wheelhouse" \
        --disable-pip-version-check "grpocli[bench]" pytest
fi
GRPO=("$PY" -m grpocli.cli.app)
step version "$OUT/version.out" "${GRPO[@]}" --version || { echo "grpo does not run; see $OUT" >&2; }

if ! skipped tests; then
    mapfile -t FILES < <(cd "$KIT" && grep -rlE "pytest\.mark\.gpu" tests --include='*.py' | sort)
    (cd "$KIT" && step gpu-tests "$OUT/gpu-tests.out" "$PY" -m pytest -q -p no:cacheprovider -m "gpu or gpu2" \
        --continue-on-collection-errors --junitxml="$OUT/gpu-tests.xml" "${FILES[@]}")
fi

for shape in $SHAPES; do
    # the shape's keys and data.max_prompt_length cut to the recipe's longest prompt: plan and bench, one step
    mapfile -t MODEL < <("$PY" -m grpocli.benchmark.presets "$shape" "$RECIPE")
    SET=("${MODEL[@]}" "model.dtype=$DTYPE" "generation.backend=$BACKEND" "generation.max_completion_length=$LENGTH"
         "train.prompts_per_step=8" "generation.num_generations=8" "train.micro_batch_size=16"
         "train.learning_rate=1e-6" "eval.every=0" "train.save_steps=0" "log.rollouts_every=0")
    if ! skipped plan && "${GRPO[@]}" plan --help > /dev/null 2>&1; then
        step "plan-$shape" "$OUT/plan-$shape.json" "${GRPO[@]}" plan "$RECIPE" "${SET[@]}" --json
    fi
    if ! skipped bench; then
        step "bench-$shape" "$OUT/bench-$shape.json" "${GRPO[@]}" bench "$RECIPE" "${SET[@]}" --steps "$STEPS" \
            --forced-lengths --only-steps --json
    fi
    if ! skipped vs-trl; then
        step "vs-trl-$shape" "$OUT/vs-trl-$shape.json" "${GRPO[@]}" bench "$RECIPE" "${SET[@]}" --steps "$STEPS" \
            --vs-trl --repeats "$REPEATS" --timeout "$LIMIT" --json
    fi
done

"$PY" "$KIT/summary.py" "$OUT" "$SHAPES" | tee "$OUT/kit.json"
