# The training side of one matrix entry: PyTorch, a compiler and the entry's CUDA toolkit; builds the
# extension for the entry's architectures (the build fails if the binary holds others), the plugin,
# and the ONNX artifacts for the entry's opsets. `docker run --rm <image>` runs alignment layers 1-2.
# lab/docker.py fills the context (src/, locks/, toolkit/, scripts/) and every build arg from
# matrix.yaml. Packages come from the host-side wheelhouse, checked against the lock: no index.
ARG BASE_BUILD

FROM ${BASE_BUILD} AS train
ARG PYTHON_VERSION
COPY scripts/ /opt/myops-scripts/
RUN sh /opt/myops-scripts/ensure_python.sh "${PYTHON_VERSION}" build
COPY toolkit/ /opt/myops-toolkit/
RUN sh /opt/myops-scripts/use_toolkit.sh
# The locked packages in a virtualenv, read from the wheel server lab/docker.py runs for the build
# on 127.0.0.1 (hashes checked): the wheels never land in a layer.
COPY locks/ /opt/myops-locks/
ARG WHEELS
RUN "python${PYTHON_VERSION}" -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --no-index --find-links "${WHEELS}" --require-hashes -r /opt/myops-locks/train.txt
ARG TORCH_VERSION ONNX_VERSION ONNXSCRIPT_VERSION NUMPY_VERSION ORT_PACKAGE ORT_VERSION
RUN /opt/venv/bin/python /opt/myops-locks/check_versions.py python=${PYTHON_VERSION} torch=${TORCH_VERSION} \
        onnx=${ONNX_VERSION} onnxscript=${ONNXSCRIPT_VERSION} numpy=${NUMPY_VERSION} ${ORT_PACKAGE}=${ORT_VERSION}
ARG ENTRY TORCH_CUDA_ARCH_LIST
ENV PATH=/opt/venv/bin:/usr/local/cuda/bin:$PATH CUDA_HOME=/usr/local/cuda PYTHONPATH=/lab \
    XDG_CACHE_HOME=/lab/.cache MYOPS_MATRIX_ENTRY=${ENTRY} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST}
WORKDIR /lab
# Alignment layers 1 and 2 inside the image.
CMD ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_swish.py", "tests/test_alignment_onnx.py", "-m", "not bigmem"]
COPY src/ /lab/
RUN python -m ops.build
RUN python -m ops.check_archs
ARG CUDA_MODE=OFF CUDA_ARCHITECTURES=""
RUN python -m ort_plugin.build --cuda "${CUDA_MODE}" ${CUDA_ARCHITECTURES:+--cuda-architectures "${CUDA_ARCHITECTURES}"}
RUN python -m ops.artifacts --out /lab/artifacts --entry "${MYOPS_MATRIX_ENTRY}"
# Labels last: the revision changes with every commit, and an ARG in scope of a RUN is part of its cache key.
ARG REVISION=unknown VERSION CREATED TOOLKIT=""
LABEL org.opencontainers.image.title="myops-lab train (${ENTRY})" org.opencontainers.image.source=myops-lab \
      org.opencontainers.image.revision=${REVISION} org.opencontainers.image.version=${VERSION} \
      org.opencontainers.image.created=${CREATED} lab.matrix.entry=${ENTRY} \
      lab.cuda.archs="${TORCH_CUDA_ARCH_LIST}" lab.cuda.toolkit="${TOOLKIT}"
