#!/usr/bin/env bash
# Build the glowgen benchmark ONNX models (resnet50, resnet18, mobilenet_v2, mlp,
# tiny_bert, lenet, eltwise_chain, det_fpn) with shared/bench/make_models.py.
#
# Usage: tools/make_bench_models.sh [OUTDIR] [--keep-bn]
#
#   OUTDIR     where to write <name>.onnx + manifest.json
#              (default: <repo>/.cache/bench_models, or
#               <repo>/.cache/bench_models_bn with --keep-bn)
#   --keep-bn  keep BatchNormalization nodes (passed to make_models.py)
#
# PyTorch lives in its own virtualenv, <repo>/.cache/torch-venv, so the project's
# own environment never needs torch.  Only the CPU wheel torch==2.13.0 is
# installed (it is available locally to pip); never plain `torch`, which would
# pull gigabytes of CUDA libraries.
#
# make_models.py is found at $GLOWGEN_SHARED/bench/make_models.py, or else at
# <repo>/../shared/bench/make_models.py.
#
# Reruns are cheap: the export is skipped when all eight .onnx files already exist
# in OUTDIR, are newer than make_models.py and were made in the same mode
# (BN folded / kept).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$REPO/.cache/torch-venv"
MODELS=(resnet50 resnet18 mobilenet_v2 mlp tiny_bert lenet eltwise_chain det_fpn)

usage() { sed -n '2,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

OUTDIR=""
KEEP_BN=0
for arg in "$@"; do
    case "$arg" in
        --keep-bn) KEEP_BN=1 ;;
        -h|--help) usage; exit 0 ;;
        -*) echo "make_bench_models.sh: unknown option: $arg" >&2; usage >&2; exit 2 ;;
        *)
            if [[ -n "$OUTDIR" ]]; then
                echo "make_bench_models.sh: more than one OUTDIR given" >&2; exit 2
            fi
            OUTDIR="$arg" ;;
    esac
done
if [[ -z "$OUTDIR" ]]; then
    if (( KEEP_BN )); then OUTDIR="$REPO/.cache/bench_models_bn"
    else OUTDIR="$REPO/.cache/bench_models"; fi
fi
VARIANT=$( (( KEEP_BN )) && echo keep-bn || echo folded-bn )

# ---------------------------------------------------------------- make_models.py
if [[ -n "${GLOWGEN_SHARED:-}" ]]; then
    MAKE_MODELS="$GLOWGEN_SHARED/bench/make_models.py"
else
    MAKE_MODELS="$REPO/../shared/bench/make_models.py"
fi
if [[ ! -f "$MAKE_MODELS" ]]; then
    echo "make_bench_models.sh: cannot find make_models.py at $MAKE_MODELS" >&2
    echo "  (set GLOWGEN_SHARED to the directory that holds bench/make_models.py)" >&2
    exit 1
fi
MAKE_MODELS="$(cd "$(dirname "$MAKE_MODELS")" && pwd)/$(basename "$MAKE_MODELS")"

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# ------------------------------------------------------------ fresh already?
up_to_date() {
    [[ -f "$OUTDIR/.variant" && "$(cat "$OUTDIR/.variant")" == "$VARIANT" ]] || return 1
    local m
    for m in "${MODELS[@]}"; do
        [[ -f "$OUTDIR/$m.onnx" && "$OUTDIR/$m.onnx" -nt "$MAKE_MODELS" ]] || return 1
    done
}

if up_to_date; then
    echo "bench models ($VARIANT) are up to date; nothing to do"
else
    # -------------------------------------------------------------- torch venv
    if [[ ! -x "$VENV/bin/python" ]]; then
        echo "creating virtualenv $VENV"
        rm -rf "$VENV"
        mkdir -p "$(dirname "$VENV")"
        python3 -m venv "$VENV"
    fi
    if "$VENV/bin/python" -c "import torch, onnx, numpy" >/dev/null 2>&1; then
        echo "torch already installed in $VENV"
    else
        echo "installing torch==2.13.0 (CPU), onnx, numpy into $VENV"
        t0=$(now)
        # (pip's "Location ... is ignored" warnings about the local indexes are noise)
        "$VENV/bin/python" -m pip install --quiet torch==2.13.0 onnx numpy 2>&1 \
            | { grep -v "is ignored: it is neither a file nor a directory" || true; }
        echo "install took $(elapsed "$t0") s"
    fi

    # ------------------------------------------------------------------ export
    mkdir -p "$OUTDIR"
    rm -f "$OUTDIR/.variant"
    args=("$OUTDIR")
    (( KEEP_BN )) && args+=(--keep-bn)
    echo "exporting models ($VARIANT) with $MAKE_MODELS"
    t0=$(now)
    "$VENV/bin/python" "$MAKE_MODELS" "${args[@]}"
    echo "export took $(elapsed "$t0") s"
    for m in "${MODELS[@]}"; do
        if [[ ! -f "$OUTDIR/$m.onnx" ]]; then
            echo "make_bench_models.sh: $OUTDIR/$m.onnx was not produced" >&2
            exit 1
        fi
    done
    echo "$VARIANT" > "$OUTDIR/.variant"
fi

OUTDIR="$(cd "$OUTDIR" && pwd)"
echo "bench models ($VARIANT) are in $OUTDIR:"
for m in "${MODELS[@]}"; do
    printf '  %-14s %s\n' "$m" "$OUTDIR/$m.onnx"
done
