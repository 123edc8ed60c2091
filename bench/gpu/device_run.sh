#!/bin/bash
# device check: env, install carried wheels + TensorRT-RTX libs, GPU tests, gpu_check bench
exec > >(tee -a $OUT/log.txt) 2>&1
export PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1
date -u; nvidia-smi -L; python3 -V; uptime
python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/*.whl || echo "PIP FAILED"
mkdir -p /tmp/site/tensorrt_rtx_libs /tmp/site/tensorrt_rtx
cp .gpu/trt_libs_init.py /tmp/site/tensorrt_rtx_libs/__init__.py
cp .gpu/trt_init.py /tmp/site/tensorrt_rtx/__init__.py
python3 - <<'PY'
import lzma, shutil
for n in ("libtensorrt_rtx.so.1", "libtensorrt_onnxparser_rtx.so.1"):
    with lzma.open(f".gpu/{n}.xz") as src, open(f"/tmp/site/tensorrt_rtx_libs/{n}", "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 24)
PY
export PYTHONPATH=/tmp/site ARBITER_CACHE_DIR=/tmp/arbcache ARBITER_CALIBRATION=$PWD/tests/calibration_reference.json

python3 -c "import tensorrt_rtx as t; print('tensorrt_rtx', t.__version__); b=t.Builder(t.Logger()); print('builder ok')" 2>&1 | tail -5
python3 -c "import arbiter, arbiter.backends.tensorrt as T; print(arbiter.__file__); print(T.TensorRT().available())" 2>&1 | tail -5
echo "=== pytest GPU"
timeout 100 python3 -m pytest -q -p no:cacheprovider -p no:logging -o addopts="" -m "gpu or interp or not slow" -rfEs tests/test_triton.py tests/test_tensorrt.py > $OUT/pytest.txt 2>&1; tail -25 $OUT/pytest.txt
echo "=== gpu_check"
timeout ${BENCH_S:-260} python3 bench/gpu_check.py --out $OUT --case-timeout 100 ${CASES:+--cases $CASES}
date -u
