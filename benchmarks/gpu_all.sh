#!/usr/bin/env bash
# Every check of packload's GPU side, on a machine with an NVIDIA GPU, in one go (about 7 minutes):
#
#   bash benchmarks/gpu_all.sh OUT [IMAGES]
#
# generates 10,000 ImageNet-like JPEGs (COUNT=N for another number; or uses IMAGES), packs them
# under OUT/work (WORK=DIR for elsewhere) (keep, lmdb and shards, and
# jpeg --max-side 256), then writes into OUT:
#   gpu_check.json  the dummy step's calibration, pin_memory copies, the small CNN, a tune run
#   doctor.json     `packload doctor` on the pack with the real GPU
#   gpu_train.json  real training steps (resnet18 when torchvision is there) fed by each loader,
#                   PackLoader(device="cuda") among them, with the GPU decoder it used
#   pytest.log      the tests that behave differently with CUDA, run with CUDA
# Each step has its own time limit and the script goes on when one fails; the exit code counts them.
#
# What is missing is installed first: packload itself (from this checkout), lmdb and simplejpeg, and
# the gpu extra (nvImageCodec and nvJPEG, for torch's CUDA major version) into OUT/work/site. Where
# no package index is reachable, put their wheels in WHEELS (default ./wheels, which git ignores)
# beforehand, from a machine that reaches one, e.g. for Python 3.12 and a CUDA 13 build of torch:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
#     --platform manylinux_2_17_x86_64 -d wheels lmdb simplejpeg nvidia-nvimgcodec-cu13 nvidia-nvjpeg
# (nvidia-nvimgcodec-cu12 and nvidia-nvjpeg-cu12 for CUDA 12). If nvImageCodec cannot be installed,
# PackLoader(device="cuda") uses torchvision's decode_jpeg, and gpu_train.json says which ran.
set -u
OUT=${1:?usage: bash benchmarks/gpu_all.sh OUT [IMAGES]}
IMAGES=${2:-}
PY=${PYTHON:-python3}
W=${WORK:-$OUT/work}  # the images and packs
mkdir -p "$OUT" "$W"
failed=0
step() {  # step NAME SECONDS COMMAND...: run it with a limit, log it, count a failure
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  echo "== $name" >&2
  timeout "$limit" "$@" || { echo "== $name FAILED (exit $?)" >&2; failed=$((failed + 1)); }
  echo "== $name took $((SECONDS - start)) s" >&2
}
export PYTHONUNBUFFERED=1
WHEELS=${WHEELS:-wheels}
SITE=$W/site
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
install_missing() {  # install_missing MODULE PACKAGE...: install the packages into SITE when MODULE does not import
  local module=$1; shift
  "$PY" -c "import $module" 2>/dev/null && return 0
  echo "== installing $* (for $module)" >&2
  if [ -d "$WHEELS" ]; then
    "$PY" -m pip install -q --no-deps --no-index --find-links "$WHEELS" --target "$SITE" "$@"
  else
    timeout 120 "$PY" -m pip install -q --no-deps --target "$SITE" "$@"
  fi || echo "== $* not installed: what needs $module is skipped or falls back" >&2
}
if ! "$PY" -c "import packload.loaders" 2>/dev/null; then  # packload from this checkout, the resize kernel built
  echo "== installing packload from $(pwd)" >&2
  "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e . >&2 || echo "== packload not installed" >&2
fi
install_missing lmdb lmdb
install_missing simplejpeg simplejpeg
CUDA_MAJOR=$("$PY" -c "import torch; print((torch.version.cuda or '12').split('.')[0])")
if [ "$CUDA_MAJOR" = 12 ]; then
  install_missing nvidia.nvimgcodec nvidia-nvimgcodec-cu12 nvidia-nvjpeg-cu12
else
  install_missing nvidia.nvimgcodec "nvidia-nvimgcodec-cu$CUDA_MAJOR" nvidia-nvjpeg
fi
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')" >&2
if [ -z "$IMAGES" ]; then
  IMAGES=$W/images
  step make_images 120 "$PY" benchmarks/make_images.py imagenet "$IMAGES" --count "${COUNT:-10000}" --classes 100 --quiet --overwrite
fi
step pack_keep_lmdb 120 "$PY" -m packload "$IMAGES" "$W/keep.lmdb" --quiet --overwrite
step pack_keep_shards 120 "$PY" -m packload "$IMAGES" "$W/keep.shards" --quiet --overwrite
step pack_small_shards 180 "$PY" -m packload "$IMAGES" "$W/small.shards" --encoding jpeg --quality 90 --max-side 256 \
  --quiet --overwrite --json
step gpu_check 180 sh -c "\"$PY\" benchmarks/gpu_check.py \"$W/keep.lmdb\" --batch-size 256 --step-ms 120 --budget 30 > \"$OUT/gpu_check.json\""
step doctor 120 sh -c "\"$PY\" -m packload doctor \"$W/keep.lmdb\" --batch-size 256 --step-ms 120 --json > \"$OUT/doctor.json\""
step gpu_train 330 sh -c "\"$PY\" benchmarks/gpu_train.py \"$IMAGES\" \"$W/keep.shards\" \"$W/small.shards\" --model resnet18 --seconds 8 > \"$OUT/gpu_train.json\""
step pytest 180 sh -c "\"$PY\" -m pytest -q -p no:cacheprovider tests/diagnose/test_tune.py tests/loaders/test_collate.py tests/loaders/test_pack_loader.py tests/diagnose/test_doctor.py tests/loaders/test_dataset.py \
  tests/loaders/test_gpu_decode.py tests/loaders/test_gpu_batch.py > \"$OUT/pytest.log\" 2>&1"
tail -3 "$OUT/pytest.log" >&2 || true
echo "gpu_all: $failed step(s) failed; results in $OUT" >&2
exit "$failed"
