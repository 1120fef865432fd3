#!/usr/bin/env bash
# Build the digits model: a small CNN trained on scikit-learn's handwritten digits (real
# weights, real labelled data; nothing is downloaded), the accuracy yardstick of int8
# quantization (tests/test_quantization.py), with shared/bench/make_digits.py.
#
# Usage: tools/make_digits.sh [OUTDIR]      (default: <repo>/.cache/digits)
#
# Writes OUTDIR/digits_cnn.onnx, OUTDIR/digits_data.npz (calibration images, a labelled test
# split) and OUTDIR/digits_manifest.json.  Runs in the PyTorch virtualenv of
# tools/make_bench_models.sh (<repo>/.cache/torch-venv), adding scikit-learn to it; skipped
# when OUTDIR is newer than make_digits.py.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$REPO/.cache/torch-venv"
OUTDIR="${1:-$REPO/.cache/digits}"
case "$OUTDIR" in -h|--help) sed -n '2,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;; esac

MAKE_DIGITS="${GLOWGEN_SHARED:-$REPO/../shared}/bench/make_digits.py"
if [[ ! -f "$MAKE_DIGITS" ]]; then
    echo "make_digits.sh: cannot find make_digits.py at $MAKE_DIGITS" >&2
    echo "  (set GLOWGEN_SHARED to the directory that holds bench/make_digits.py)" >&2
    exit 1
fi

if [[ -f "$OUTDIR/digits_manifest.json" && "$OUTDIR/digits_manifest.json" -nt "$MAKE_DIGITS" ]]; then
    echo "digits model is up to date in $OUTDIR"
    exit 0
fi
if [[ ! -x "$VENV/bin/python" ]]; then
    echo "creating virtualenv $VENV"
    mkdir -p "$(dirname "$VENV")"
    python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import torch, onnx, numpy, sklearn" >/dev/null 2>&1; then
    echo "installing torch==2.13.0 (CPU), onnx, numpy, scikit-learn into $VENV"
    "$VENV/bin/python" -m pip install --quiet torch==2.13.0 onnx numpy scikit-learn 2>&1 \
        | { grep -v "is ignored: it is neither a file nor a directory" || true; }
fi
mkdir -p "$OUTDIR"
"$VENV/bin/python" "$MAKE_DIGITS" "$OUTDIR"
echo "digits model in $(cd "$OUTDIR" && pwd)"
