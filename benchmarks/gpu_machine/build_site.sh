#!/bin/bash
# usage: build_bundle.sh PYVER(3.11|3.12) WHEELDIR SITEDIR NAMES...
set -e
PYV=$1; WH=$2; SITE=$3; shift 3
rm -rf "$SITE"; mkdir -p "$SITE"
files=()
for n in "$@"; do
  f=$(ls "$WH" | grep -i -E "^${n}-[0-9]" | head -1)
  [ -n "$f" ] || { echo "missing wheel for $n"; exit 1; }
  files+=("$WH/$f")
done
python3 -m pip install -q --no-deps --no-compile --no-index --only-binary=:all: --python-version $PYV --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 --platform any \
  --target "$SITE" "${files[@]}"
R=$SITE/ray
# trim ray: Java jars, the dashboard's web client, the libraries the simulation never imports, tests
rm -rf $R/jars $R/dashboard/client $R/rllib $R/tune $R/train $R/serve $R/data $R/llm
find "$SITE" -depth -type d \( -name tests -o -name __pycache__ \) -exec rm -rf {} +
find "$SITE" -name "*.map" -delete
rm -rf "$SITE"/cvxpy/tests
# strip native code
find "$SITE" -type f \( -name "*.so" -o -name "*.so.*" \) -exec strip --strip-unneeded {} + 2>/dev/null || true
strip --strip-unneeded $R/core/src/ray/gcs/gcs_server $R/core/src/ray/raylet/raylet || true
# console scripts: any python3 on PATH
for s in "$SITE"/bin/*; do
  head -c 2 "$s" | grep -q '#!' && sed -i '1s|^#!.*python.*$|#!/usr/bin/env python3|' "$s"
done
du -sh "$SITE"
