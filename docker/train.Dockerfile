# The training side of one matrix entry: PyTorch + compiler, the extension built for the entry's
# TORCH_CUDA_ARCH_LIST (and checked), the ONNX artifacts exported for the entry's opsets.
# lab/docker.py fills everything from matrix.yaml: the context (src/ with the pinned ORT headers in
# src/.cache and the entry's environment in src/.image.env, wheels-train/, locks/), build args (every
# version pin is one, and the build fails if what got installed differs), labels.
# Packages come from the host-side wheelhouse, checked against the lock's hashes: no network.
# NOTE: instructions are few and merged on purpose: under the vfs storage driver each one is a
# full copy of the image's filesystem.
ARG BASE_BUILD

FROM ${BASE_BUILD} AS deps
# Metadata first, while the image is small (see the NOTE above); the script arrives with src/.
ENTRYPOINT ["/lab/.image-entrypoint"]
# Alignment layers 1 and 2 inside the image.
CMD ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_swish_extension.py", "tests/test_alignment_onnx.py", "-m", "not bigmem"]
ARG PYTHON_VERSION TORCH_VERSION ONNX_VERSION ONNXSCRIPT_VERSION NUMPY_VERSION ORT_PACKAGE ORT_VERSION
COPY locks/train.txt locks/check_versions.py wheels-train/ /tmp/wheels/
# NVIDIA CUDA bases ship no Python; the lab's own Debian bases already have it (and no network).
RUN (command -v python3 >/dev/null && python3 -c "import venv" 2>/dev/null || \
     (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 python3-venv python3-dev g++ make cmake && rm -rf /var/lib/apt/lists/*)) \
 && python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --no-index --find-links /tmp/wheels --require-hashes -r /tmp/wheels/train.txt \
 && /opt/venv/bin/python /tmp/wheels/check_versions.py python=${PYTHON_VERSION} torch=${TORCH_VERSION} \
        onnx=${ONNX_VERSION} onnxscript=${ONNXSCRIPT_VERSION} numpy=${NUMPY_VERSION} ${ORT_PACKAGE}=${ORT_VERSION}

FROM deps AS train
COPY src/ /lab/
RUN /lab/.image-entrypoint sh -c 'rm -rf /tmp/wheels \
 && python -m ops.build \
 && python -m ops.check_archs \
 && python -m ort_plugin.build --cuda AUTO \
 && python -m ops.artifacts --out /lab/artifacts --entry "$MYOPS_MATRIX_ENTRY"'
# Labels last and in one instruction: the revision changes with every commit, and under vfs each
# instruction is a copy of the whole image. (ARG here, not earlier: an ARG in scope of a RUN is part
# of that RUN's cache key.)
ARG ENTRY REVISION=unknown VERSION CREATED
LABEL org.opencontainers.image.title="myops-lab train (${ENTRY})" org.opencontainers.image.source=myops-lab \
      org.opencontainers.image.revision=${REVISION} org.opencontainers.image.version=${VERSION} \
      org.opencontainers.image.created=${CREATED} lab.matrix.entry=${ENTRY}
