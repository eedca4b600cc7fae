#!/bin/sh
# use_toolkit.sh: /usr/local/cuda is the base image's own toolkit when it has one (an official
# nvidia/cuda devel base), else the one lab/toolkit.py assembled for the entry (copied to
# /opt/myops-toolkit), else nothing (a CPU entry).
set -eu
if [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "CUDA toolkit: the base image's ($(/usr/local/cuda/bin/nvcc --version | tail -n 2 | head -n 1))"
  rm -rf /opt/myops-toolkit
elif [ -x /opt/myops-toolkit/bin/nvcc ]; then
  ln -s /opt/myops-toolkit /usr/local/cuda
  echo "CUDA toolkit: $(cat /opt/myops-toolkit/toolkit.json | tr -d '\n ')"
else
  echo "CUDA toolkit: none (CPU entry)"
fi
