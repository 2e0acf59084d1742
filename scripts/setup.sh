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

[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "setup.sh: missing: ${missing[*]}; install them with apt as root (this user cannot)" >&2
  exit 1
fi
echo "setup.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup.sh: done" >&2
