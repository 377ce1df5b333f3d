#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The Python package's CI: a fresh venv, `pip install ".[test]"` from the repository root
# without the CUDA backend (CI machines compile CUDA but have no GPU), mpi4py when Open
# MPI is there, then pytest over python/tests. Prints pytest's summary line; exits
# nonzero on any failure.
set -uo pipefail
cd "$(dirname "$0")/.."
top=$(pwd)
work="$top/build-python-ci"
log() { printf '\n=== %s\n' "$*"; }

# ---- what the build and the tests need (Debian 12 packages) -----------------------------
pkgs="gcc pkg-config python3-dev python3-venv libopenblas-dev libopenmpi-dev openmpi-bin zlib1g-dev dataset-fashion-mnist"
if command -v apt-get >/dev/null 2>&1; then
  need=""
  for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || need="$need $p"; done
  if [ -n "$need" ]; then
    log "installing:$need"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends $need >/dev/null || {
      echo "apt-get install failed"; exit 1; }
  fi
fi

rm -rf "$work"
mkdir -p "$work"
log "fresh venv: $work/venv"
python3 -m venv "$work/venv" || exit 1
py="$work/venv/bin/python"
"$py" -m pip install -q --upgrade pip || exit 1

log "pip install .[test] -Csetup-args=-Dcuda=disabled"
start=$(date +%s)
if ! "$py" -m pip install ".[test]" -Csetup-args=-Dcuda=disabled >"$work/pip.log" 2>&1; then
  tail -n 60 "$work/pip.log"
  echo "pip install failed"
  exit 1
fi
echo "installed in $(( $(date +%s) - start )) s"
if command -v mpirun >/dev/null 2>&1 && command -v mpicc >/dev/null 2>&1; then
  "$py" -m pip install -q mpi4py >"$work/mpi4py.log" 2>&1 || echo "mpi4py not installed: the MPI test will be skipped"
fi

log "pytest python/tests"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# from the tests' own directory, so `import xknn` finds the installed package, not python/xknn
cd "$top/python/tests" || exit 1
"$py" -m pytest -q -rs 2>&1 | tee "$work/pytest.log"
status=${PIPESTATUS[0]}
log "summary"
grep -E '^(=+ )?[0-9]+ (passed|failed)|(passed|failed|error).* in [0-9.]+s' "$work/pytest.log" | tail -n 1
exit "$status"
