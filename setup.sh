#!/usr/bin/env bash
# One-command setup on a fresh machine: the package with its dev extras, then an OpenCL CPU device.
#
# `pyopencl[pocl]` brings PoCL from pip, and on most x86-64 CPUs that is all OpenCL needs. Its
# PoCL 3.0 is built on LLVM 14, which does not know newer CPUs (AMD Zen 5 among them) and then
# fails every kernel build with "unknown target CPU 'generic'". Only in that case, and only where
# apt-get can run as root (CI, containers), this installs the distribution's PoCL, which
# `python -m tile devices` then lists as opencl_cpu.0. Elsewhere it says what to install; the
# OpenCL tests skip with the reason until a working device exists.
#
# The framework bridges (tile.torch, tile.jax) and tile.onnx are optional extras, installed here so
# that the tests cover them: PyTorch as its CPU build first (where no torch is installed yet; from
# the configured indexes, else from PyTorch's own CPU index), so that the `torch` extra is already
# satisfied and pip never fetches the default wheel with its CUDA libraries.
set -euo pipefail
cd "$(dirname "$0")"
TORCH_CPU="torch==2.13.0+cpu"
if ! python -c "import torch" >/dev/null 2>&1; then
    python -m pip install "$TORCH_CPU" ||
        python -m pip install "$TORCH_CPU" --extra-index-url https://download.pytorch.org/whl/cpu
fi
python -m pip install -e ".[dev,torch,jax,onnx]"
if python -m tile devices --fresh --require opencl_cpu >/dev/null 2>&1; then
    exit 0
fi
echo "setup: no working OpenCL CPU device from pip's PoCL:"
python -m tile devices | grep -i opencl || true
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "setup: installing the distribution's PoCL (apt-get install pocl-opencl-icd)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq pocl-opencl-icd
    python -m tile devices --fresh --require opencl_cpu
else
    echo "setup: install your distribution's PoCL (Debian/Ubuntu: pocl-opencl-icd) for opencl_cpu.0;"
    echo "       until then the OpenCL tests skip and say why"
fi
