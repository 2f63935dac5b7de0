#!/usr/bin/env bash
# The figures for the record of the crop-first JPEG batch decoder, in one run; each is a ratio of
# contenders measured side by side (interleaved rounds) in this run:
#
#   (a) RandomResizedCrop(224) + flip: PackLoader against FFCV's training pipeline
#       (bench_train_crop_ffcv.py, the 20k photos packed --encoding jpeg --max-side 256)
#   (b) CenterCrop(224): PackLoader against FFCV's CenterCropRGBImageDecoder((224, 224), ratio=224/256),
#       the same packs (bench_train_crop_ffcv.py --crop center --reuse)
#   (c) a training loop that holds the GIL half of each step (bench_gil.py), CenterCrop and
#       RandomResizedCrop: PackLoader against itself with an idle loop, JPEGs one by one, batch_loader
#   (d) a `keep` pack of the full-size photos, RandomResizedCrop(224) + flip: PackLoader decoding only
#       each crop's region against the same loader decoding whole images (bench_train_crop_ffcv.py
#       --cases keep --loaders packloader,packloader-whole)
#
#   bash benchmarks/crop_first_all.sh                        # the record: about 15 min on 2 cores (estimated)
#   CROP_FIRST_LIMIT=300 bash benchmarks/crop_first_all.sh   # smoke run: 300 photos, 1 round, short windows
#
# Needs .venv-peers with FFCV (BENCHMARKS.md, "Reproduce") and the photos
# (`python benchmarks/make_images.py imagenet bench-data/imagenet`). Writes bench-results/crop-first/
# (the smoke run: bench-results/crop-first/smoke/): each part's .md and .json, run.log, SUMMARY.md.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${CROP_FIRST_PYTHON:-.venv-peers/bin/python}
DATA=${CROP_FIRST_DATA:-bench-data/imagenet}
LIMIT=${CROP_FIRST_LIMIT:-}
if [[ -n $LIMIT ]]; then
    OUT=bench-results/crop-first/smoke ROUNDS=1 SUBSET=(--limit "$LIMIT")
    GIL_TIMES=(--seconds 1 --repeats 1 --calibrate-s 0.5 --warmup 1)
else
    OUT=bench-results/crop-first ROUNDS=5 SUBSET=()
    GIL_TIMES=(--seconds 3 --repeats 5)
fi
WORK=$OUT/work

[[ -x $PY ]] || { echo "$PY: missing; make the peer venv as BENCHMARKS.md says" >&2; exit 2; }
[[ -d $DATA ]] || { echo "$DATA: missing; python benchmarks/make_images.py imagenet $DATA" >&2; exit 2; }
# FFCV must be there (the scripts would otherwise report it missing and go on), packload must be
# this checkout's, and its compiled batch decoder built from the sources as they are now.
"$PY" - <<'EOF' || exit 2
import pathlib, sys
try:
    import ffcv.libffcv, ffcv.loader  # noqa: F401
except ImportError as exc:
    sys.exit(f"FFCV does not import ({exc}): install it in {sys.prefix} as BENCHMARKS.md says")
import packload
from packload.core import jpeg_kernel
core = pathlib.Path(packload.__file__).parent / "core"
if core.parent.parent != pathlib.Path.cwd():
    sys.exit(f"packload is imported from {core.parent}, not this checkout: pip install -e . in the venv")
if not jpeg_kernel.available():
    sys.exit(f"the batch decoder is not in use: {jpeg_kernel.unavailable_reason()}")
headers = max((p.stat().st_mtime for p in core.glob("**/*.h")), default=0)
built = {c: next(core.glob(f"{c.stem}.*.so"), None) for c in core.glob("_*.c")}
if any(so is None or so.stat().st_mtime < max(c.stat().st_mtime, headers) for c, so in built.items()):
    sys.exit(f"packload's compiled kernels are older than their sources: {sys.executable} -m pip install --no-deps -e .")
EOF

mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1
echo "crop-first record: $(date -u '+%Y-%m-%d %H:%M UTC'), packload $(git rev-parse --short HEAD)" \
     "($(git status --porcelain -- packload packer loaders setup.py | wc -l) library files changed)," \
     "$(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)${LIMIT:+, SMOKE RUN of $LIMIT photos}"

echo "== (a) RandomResizedCrop(224) + flip against FFCV"
"$PY" benchmarks/bench_train_crop_ffcv.py --data "$DATA" "${SUBSET[@]}" --cases jpeg --loaders packloader,ffcv \
    --rounds "$ROUNDS" --out "$OUT/train-crop" --work "$WORK"

echo "== (b) CenterCrop(224) against FFCV"
"$PY" benchmarks/bench_train_crop_ffcv.py --data "$DATA" "${SUBSET[@]}" --cases jpeg --loaders packloader,ffcv \
    --rounds "$ROUNDS" --crop center --reuse --out "$OUT/center-crop" --work "$WORK"

echo "== (c) a loop holding the GIL 50 % of each step"
for crop in center random; do
    flags=(); [[ $crop == random ]] && flags=(--random-crop)
    "$PY" benchmarks/bench_gil.py "$WORK/imagenet-jpeg256.shards" "${flags[@]}" \
        --contenders packloader,packloader_per_image,batch_loader --fractions 0,50 --switch-ms 5 \
        "${GIL_TIMES[@]}" --json "$OUT/gil-$crop.json" | tee "$OUT/gil-$crop.md"
done

echo "== (d) keep pack: decoding only the crop against decoding whole images"
"$PY" benchmarks/bench_train_crop_ffcv.py --data "$DATA" "${SUBSET[@]}" --cases keep \
    --loaders packloader,packloader-whole --rounds "$ROUNDS" --out "$OUT/keep-crop" --work "$WORK"

"$PY" - "$OUT" <<'EOF' | tee "$OUT/SUMMARY.md"
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
def span(s):
    return f"{s['median']:.2f}x [{s['min']:.2f}-{s['max']:.2f}], {s['n']} rounds" if s.get("n") else "no figure"
for part, name in (("(a) RandomResizedCrop(224) + flip", "train-crop"), ("(b) CenterCrop(224)", "center-crop")):
    case = json.loads((out / name / "train-crop.json").read_text())["cases"][0]
    print(f"- {part}, {case['images']:,} photos: PackLoader / FFCV {span(case['loaders']['packloader']['ratio_to_ffcv'])}")
for crop in ("center", "random"):
    rows = {(r["contender"], r["fraction"]): r for r in json.loads((out / f"gil-{crop}.json").read_text())["rows"]}
    ours = rows[("packloader", 0.5)]
    print(f"- (c) {crop} crop, loop holding the GIL 50 %: PackLoader keeps {ours['vs_fraction_0']:.2f}x its idle-loop "
          f"rate; {ours['images_per_s'] / rows[('packloader_per_image', 0.5)]['images_per_s']:.2f}x one by one, "
          f"{ours['images_per_s'] / rows[('batch_loader', 0.5)]['images_per_s']:.2f}x batch_loader")
case = json.loads((out / "keep-crop" / "train-crop.json").read_text())["cases"][0]
print(f"- (d) keep pack of the full-size photos, {case['images']:,} photos, RandomResizedCrop(224) + flip: "
      f"decoding only the crop / whole images {span(case['loaders']['packloader']['ratio_to_packloader-whole'])}")
EOF
echo "Results: $OUT/ (SUMMARY.md, run.log, train-crop/, center-crop/, keep-crop/, gil-*.md|json)"
