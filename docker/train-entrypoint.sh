#!/bin/sh
# Entry point of the train image: the environment lab/docker.py wrote for this entry (venv on PATH,
# matrix entry, arch list, header cache), then the command. Kept out of ENV instructions because
# under the vfs storage driver every Dockerfile instruction copies the whole image.
set -a
. /lab/.image.env
set +a
cd /lab
exec "$@"
