#!/bin/bash
# Run `python3 benchmarks/gpu_speedup.py --round-only` on a lent GPU machine (no network), from the repository root:
#   bash .whl/gpu_run.sh            (carry: [".whl"])
# What travels in .whl:
#   site-cp312.tar.xz   Flower 1.42.0, Ray 2.55.1 (trimmed, stripped), CVXPY 1.9.3 (+ Clarabel, QDLDL), Hydra/OmegaConf,
#                       datasets, flwr-datasets, seqeval and the missing runtime deps of Flower's SuperLink
#                       (fastapi, uvicorn, sqlalchemy, alembic, pydantic, cryptography, ...), already installed for
#                       CPython 3.12 / manylinux x86-64: unpacked into /tmp/site, nothing pip-installed.
#   data.tar.xz         Multi30K (raw + tok/), unpacked into ./data
#   optional/transformers-5.24.0.tar.xz   only used with WITH_TRANSFORMERS=1, or when the image's transformers is
#                       missing or older than 5.9 (the image had 5.17.0 when last read).
# Env: OUT (results folder; default ./gpu_out), ROUND_TIMEOUT (default 480 s), BENCH_ARGS (default --round-only).
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/gpu_out}
mkdir -p "$OUT"
SITE=/tmp/site
PY=$(command -v python3)
PYEXE=$("$PY" -c 'import sys; print(sys.executable)')

echo "== $(date -u +%FT%TZ) unpacking into $SITE (python: $PYEXE)"
rm -rf "$SITE" && mkdir -p "$SITE"
tar --no-same-owner -xJf .whl/site-cp312.tar.xz -C "$SITE" || { echo "error: site-cp312.tar.xz did not unpack"; exit 2; }

tf_ok=$("$PY" - <<'EOF' 2>/dev/null
try:
    import transformers
    from packaging.version import Version
    print(int(Version(transformers.__version__) >= Version("5.9")))
except Exception:
    print(0)
EOF
)
if [ "${WITH_TRANSFORMERS:-0}" = 1 ] || [ "$tf_ok" != 1 ]; then
    echo "== using the carried transformers 5.24.0 (image's is missing/old, or WITH_TRANSFORMERS=1)"
    tar --no-same-owner -xJf .whl/optional/transformers-5.24.0.tar.xz -C "$SITE"
fi

# console scripts (flwr, flower-superlink, flower-superexec, flwr-simulation, ...) run this python
for s in "$SITE"/bin/*; do
    head -c 2 "$s" | grep -q '#!' && sed -i "1s|^#!.*python.*\$|#!$PYEXE|" "$s"
done
# `collapipe` console script (not needed by gpu_speedup.py, which runs `python -m collapipe_flwr`)
mkdir -p /tmp/bin
printf '#!/bin/sh\nexec "%s" -m collapipe_flwr.apps.cli "$@"\n' "$PYEXE" > /tmp/bin/collapipe
chmod +x /tmp/bin/collapipe

export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$SITE/bin:/tmp/bin:$PATH"
export FLWR_DISABLE_UPDATE_CHECK=1 FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 RAY_USAGE_STATS_ENABLED=0
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1

echo "== data into ./data"
mkdir -p data
tar --no-same-owner -xJf .whl/data.tar.xz -C data || { echo "error: data.tar.xz did not unpack"; exit 2; }
ls -la data/multi30k/tok

echo "== versions"
"$PY" -c '
import flwr, ray, cvxpy, hydra, omegaconf, datasets, flwr_datasets, torch, transformers
print("flwr", flwr.__version__, "| ray", ray.__version__, "| cvxpy", cvxpy.__version__, cvxpy.installed_solvers(),
      "| hydra", hydra.__version__, "| datasets", datasets.__version__, "| torch", torch.__version__,
      "| transformers", transformers.__version__, "from", transformers.__file__)
print("cuda available:", torch.cuda.is_available(), "| devices:", torch.cuda.device_count(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
' 2>&1 | tee "$OUT/versions.txt"
command -v flwr flower-superlink flower-superexec flwr-simulation | tee -a "$OUT/versions.txt"
nproc | sed 's/^/cpus: /' | tee -a "$OUT/versions.txt"

echo "== $(date -u +%FT%TZ) python3 benchmarks/gpu_speedup.py ${BENCH_ARGS:---round-only}"
# shellcheck disable=SC2086
PYTHONUNBUFFERED=1 timeout "${ROUND_TIMEOUT:-480}" "$PY" benchmarks/gpu_speedup.py ${BENCH_ARGS:---round-only} 2>&1 | tee "$OUT/gpu_round.log"
rc=${PIPESTATUS[0]}
echo "== $(date -u +%FT%TZ) gpu_speedup.py exited $rc"
# on failure or timeout: the flwr logs of the smoke runs, if any are left (the benchmark's temp folder is removed on exit)
if [ "$rc" != 0 ]; then
    find /tmp -maxdepth 4 -name flwr.log -newer .whl/gpu_run.sh 2>/dev/null | head -4 | while read -r f; do
        echo "--- $f"; tail -40 "$f"; done | tee "$OUT/flwr_tail.log"
fi
exit "$rc"
