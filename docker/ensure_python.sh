#!/bin/sh
# ensure_python.sh VERSION [build]: the entry's Python (with venv) in this base image, plus a C++
# toolchain and CMake with `build`. The lab's own bases already have them (no network needed); an
# official nvidia/cuda base has none, and gets them from its distribution (Ubuntu: python3.X).
set -eu
version=$1
kind=${2:-runtime}
have_python() { command -v "python$version" >/dev/null && "python$version" -c "import venv, ensurepip" 2>/dev/null; }
have_tools() { [ "$kind" != build ] || { command -v g++ >/dev/null && command -v make >/dev/null && command -v cmake >/dev/null; }; }
if have_python && have_tools; then
  echo "base image has python$version$( [ "$kind" = build ] && echo ', g++, make and cmake')"
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "error: this base image has no python$version (with venv)$( [ "$kind" = build ] && echo ', g++, make or cmake') and no apt-get to install them: use a base that has them (matrix.yaml pins python $version)" >&2
  exit 1
fi
packages="python$version python$version-venv"
[ "$kind" = build ] && packages="$packages python$version-dev g++ make cmake"
if ! { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $packages; }; then
  echo "error: this base image has no python$version (with venv)$( [ "$kind" = build ] && echo ', g++, make or cmake'), and apt could not install $packages (its distribution lacks them, or its mirror cannot be reached): use a base that has them, e.g. Debian bookworm or Ubuntu 22.04 (python3.11 in jammy-updates); matrix.yaml pins python $version" >&2
  exit 1
fi
rm -rf /var/lib/apt/lists/*
have_python || { echo "error: python$version was installed but cannot make a venv" >&2; exit 1; }
