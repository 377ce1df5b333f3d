#!/usr/bin/env bash
# The Python package's CI: a fresh venv, `pip install ".[test]"` from the repository root
# without the CUDA backend (CI machines compile CUDA but have no GPU), mpi4py when Open
# MPI is there, then pytest over python/tests. Prints pytest's summary line; exits
# nonzero on any failure.
set -uo pipefail
cd "$(dirname "$0")/.."
top=$(pwd)
work="$top/build-python-ci"
log() { printf '\n=== %s\n' "$*"; }

if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
  log "installing: python3-venv"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-venv python3-dev \
    >/dev/null || { echo "apt-get install python3-venv failed"; exit 1; }
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
