#!/usr/bin/env bash
# The whole test suite: every Rust test of the workspace, then the Python package — built as a
# wheel with maturin and installed into a virtual environment of its own — and its pytest
# suite (against onnxruntime). Needs only the Rust toolchain, Python 3 with pip and the package
# registries; the environment is kept in target/python-venv and reused.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo test --workspace --release

venv="${GEARSIM_VENV:-target/python-venv}"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q maturin numpy onnx onnxruntime pytest grpcio-tools "dask[distributed]"
"$venv/bin/python" -m pip install -q --force-reinstall --no-deps ./host/python
"$venv/bin/python" -m pytest -q host/python/tests

# The README's Slurm recipes on a one-node Slurm cluster started here (installs Debian's
# slurm-wlm when missing, which needs root). GEARSIM_SKIP_SLURM=1 leaves it out, saying so.
if [ "${GEARSIM_SKIP_SLURM:-0}" = 1 ]; then
    echo "run-all: the Slurm test was skipped (GEARSIM_SKIP_SLURM=1)"
else
    tests/slurm/run.sh
fi
