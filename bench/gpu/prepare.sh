#!/bin/bash
# Prepare the folder a GPU session carries to the device machine (.gpu/, ignored by git):
# the device image has torch (2.11+cu130 when last seen), Python 3.12, Triton, ONNX Runtime,
# transformers, but no pydantic, OpenVINO or TensorRT. What this puts in .gpu/ (about 62 MB:
# the device tool carries at most 64 MiB with the working tree):
#   - wheels for Python 3.12: pydantic, pydantic_core, annotated_types, typing_inspection,
#     tensorrt_rtx_cu12_bindings, and arbiter itself (built from the working tree);
#   - TensorRT for RTX's two libraries from this venv, xz-compressed (the x86 filter takes
#     libtensorrt_rtx.so.1 from 221 to 57 MB; ~4 min) and the packages' __init__ files;
#   - bench/gpu/device_run.sh, which unpacks them there and runs the GPU tests and
#     bench/gpu_check.py.
# Then, from the repository root, through the device tool:
#   run(command="bash .gpu/run.sh", carry=[".gpu"], timeout_s=560)
#   (CASES="arbiter:inductor@float16,..." BENCH_S=... before `bash` to choose the cases)
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx "/.gpu/" .git/info/exclude 2>/dev/null || echo "/.gpu/" >> .git/info/exclude
mkdir -p .gpu
site=.venv/lib/python3.11/site-packages
dl="python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
    --platform manylinux2014_x86_64 -d .gpu"
# the versions this venv holds (pydantic pins its pydantic_core exactly); one of each
ver() { .venv/bin/python -c "import importlib.metadata as m; print(m.version('$1'))"; }
rm -f .gpu/pydantic*.whl .gpu/annotated_types*.whl .gpu/typing_inspection*.whl .gpu/tensorrt_rtx*.whl
$dl "pydantic==$(ver pydantic)" "pydantic_core==$(ver pydantic_core)" \
    "annotated_types==$(ver annotated_types)" "typing_inspection==$(ver typing_inspection)" \
    "tensorrt_rtx_cu12_bindings==$(ver tensorrt_rtx_cu12_bindings)"
rm -f .gpu/torch_arbiter-*.whl
.venv/bin/pip wheel -q --no-deps --no-build-isolation . -w .gpu/
cp $site/tensorrt_rtx/__init__.py .gpu/trt_init.py
cp $site/tensorrt_rtx_libs/__init__.py .gpu/trt_libs_init.py
for lib in libtensorrt_rtx.so.1 libtensorrt_onnxparser_rtx.so.1; do
    [ -f .gpu/$lib.xz ] || xz -T1 --x86 --lzma2=preset=9e -c $site/tensorrt_rtx_libs/$lib > .gpu/$lib.xz
done
cp bench/gpu/device_run.sh .gpu/run.sh
du -sh .gpu
