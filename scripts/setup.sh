#!/usr/bin/env bash
# Installs what kdalab needs and is missing, with apt (Debian 12). Idempotent; silent when all is
# there. Checks files, not package names, so it also passes on the Ubuntu 24.04 GPU machine, where
# everything is present and nothing can be installed (it never calls apt there).
set -euo pipefail
missing=()
have_header() { for d in /usr/include /usr/local/include /usr/include/hdf5/serial; do [ -e "$d/$1" ] && return 0; done; return 1; }
need_header() { have_header "$1" || missing+=("$2"); }
need_cmd() { command -v "$1" >/dev/null 2>&1 || missing+=("$2"); }

need_cmd cmake cmake
need_cmd g++ g++
need_cmd make make
need_cmd git git
need_header eigen3/Eigen/Dense libeigen3-dev
need_header boost/multiprecision/cpp_bin_float.hpp libboost-dev
need_header H5Cpp.h libhdf5-dev
have_header catch2/catch.hpp || have_header catch2/catch_all.hpp || missing+=(catch2)
need_header fmt/format.h libfmt-dev
need_header CLI/CLI.hpp libcli11-dev
need_header nlohmann/json.hpp nlohmann-json3-dev
/usr/bin/python3 -c 'import h5py' >/dev/null 2>&1 || missing+=(python3-h5py)
/usr/bin/python3 -c 'import matplotlib' >/dev/null 2>&1 || missing+=(python3-matplotlib)
# The Slurm test (ctest label slurm) starts munged, slurmctld and slurmd itself: Debian's packages, where apt can run.
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  need_cmd munged munge
  need_cmd slurmctld slurmctld
  need_cmd slurmd slurmd
  need_cmd sbatch slurm-client
elif ! command -v slurmctld >/dev/null 2>&1; then
  echo "setup.sh: no Slurm and no apt: the slurm test fails here; leave it out with ctest -LE 'gpu|slurm'" >&2
fi
# The Python package (python/) needs venv and the C headers of /usr/bin/python3; optional: without them
# (and no apt to install them) the package is skipped, not the rest.
can_apt=0
[ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1 && can_apt=1
py_inc=$(/usr/bin/python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null || true)
py_ok=1
/usr/bin/python3 -c 'import ensurepip' >/dev/null 2>&1 || { py_ok=0; [ $can_apt = 1 ] && missing+=(python3-venv); }
[ -n "$py_inc" ] && [ -e "$py_inc/Python.h" ] || { py_ok=0; [ $can_apt = 1 ] && missing+=(python3-dev); }

if [ ${#missing[@]} -gt 0 ]; then
  if [ $can_apt = 0 ]; then
    echo "setup.sh: missing: ${missing[*]}; install them with apt as root (this user cannot)" >&2
    exit 1
  fi
  echo "setup.sh: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  echo "setup.sh: done" >&2
  py_ok=1
fi

# The virtual environment of the Python package: build/venv (VENV=dir), from /usr/bin/python3, with nanobind
# and scikit-build-core (the build), numpy and pytest from PyPI. The package itself is built by CMake with
# -DKDALAB_PYTHON=ON (scripts/test.sh) and installed into the venv as kdalab-build.pth, which puts python/ and
# build/<preset>/python on its path. `pip install .` is the stand-alone install (python/README.md).
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${VENV:-$root/build/venv}
[ $py_ok = 1 ] || { echo "setup.sh: no python3-venv or python3-dev: the Python package is skipped" >&2; exit 0; }
if ! "$venv/bin/python" -c 'import nanobind, scikit_build_core, numpy, pytest' >/dev/null 2>&1; then
  echo "setup.sh: making the Python environment $venv (pip: nanobind scikit-build-core numpy pytest)" >&2
  if ! { /usr/bin/python3 -m venv "$venv" && "$venv/bin/python" -m pip install -q --disable-pip-version-check \
           nanobind scikit-build-core numpy pytest; } >&2; then
    echo "setup.sh: the Python environment could not be made (no network?): the Python package is skipped" >&2
    exit 0
  fi
fi
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
printf '%s\n%s\n' "$root/python" "$root/build/${PRESET:-default}/python" > "$site/kdalab-build.pth"
