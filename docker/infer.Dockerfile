# The inference side of one matrix entry, meant to be pulled onto a (GPU) host: onnxruntime(-gpu),
# numpy, the plugin, the artifacts and the torch-free runner. NO PyTorch in the final stage.
#   docker run --rm [--gpus all] <image> verify | dump --out DIR | bench
# Labels (OCI source, revision, version, created, matrix entry) come from build args lab/docker.py fills.
# NOTE: metadata instructions come early, while the image is small: under the vfs storage driver
# every instruction copies the whole image.
ARG BASE_BUILD
ARG BASE_RUNTIME
ARG TRAIN_IMAGE

FROM ${TRAIN_IMAGE} AS artifacts

# The plugin, compiled with CMake against the pinned ORT headers only.
FROM ${BASE_BUILD} AS plugin
ARG CUDA_MODE=OFF CUDA_ARCHITECTURES=""
COPY src/ /src/
RUN (command -v cmake >/dev/null || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y \
        --no-install-recommends g++ make cmake && rm -rf /var/lib/apt/lists/*)) \
 && cmake -S /src/ort_plugin -B /build -DCMAKE_BUILD_TYPE=Release -DMYOPS_CUDA=${CUDA_MODE} \
        -DORT_INCLUDE_DIR="$(dirname "$(ls /src/.cache/myops-lab/ort-headers/*/include/onnxruntime_c_api.h)")" \
        ${CUDA_ARCHITECTURES:+"-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES}"} \
 && cmake --build /build -j "$(nproc)"

FROM ${BASE_RUNTIME} AS deps
ARG ENTRY PYTHON_VERSION ORT_PACKAGE ORT_VERSION NUMPY_VERSION
ENV PATH=/opt/venv/bin:$PATH PYTHONPATH=/opt/myops/app MYOPS_ORT_PLUGIN=/opt/myops/lib/libmyops_ort.so \
    MYOPS_ARTIFACTS=/opt/myops/artifacts MYOPS_MATRIX_ENTRY=${ENTRY}
ENTRYPOINT ["python", "-m", "ort_plugin.runner"]
CMD ["verify"]
COPY locks/infer.txt locks/check_versions.py wheels-infer/ /tmp/wheels/
RUN (command -v python3 >/dev/null && python3 -c "import venv" 2>/dev/null || \
     (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 python3-venv && rm -rf /var/lib/apt/lists/*)) \
 && python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --no-index --find-links /tmp/wheels --require-hashes -r /tmp/wheels/infer.txt \
 && /opt/venv/bin/python /tmp/wheels/check_versions.py python=${PYTHON_VERSION} numpy=${NUMPY_VERSION} \
        ${ORT_PACKAGE}=${ORT_VERSION} \
 && rm -rf /tmp/wheels && useradd --create-home --uid 10001 lab

FROM deps AS infer
COPY --from=plugin /build/libmyops_ort.so /opt/myops/lib/libmyops_ort.so
COPY --from=artifacts /lab/artifacts /opt/myops/artifacts
COPY app/ /opt/myops/app/
USER lab
# Labels last and in one instruction: the revision changes with every commit, and under vfs each
# instruction is a copy of the whole image. (ARG here, not earlier: an ARG in scope of a RUN is part
# of that RUN's cache key.)
ARG ENTRY REVISION=unknown VERSION CREATED IMAGE
ENV MYOPS_GIT_SHA=${REVISION} MYOPS_IMAGE=${IMAGE}
LABEL org.opencontainers.image.title="myops-lab infer (${ENTRY})" org.opencontainers.image.source=myops-lab \
      org.opencontainers.image.revision=${REVISION} org.opencontainers.image.version=${VERSION} \
      org.opencontainers.image.created=${CREATED} lab.matrix.entry=${ENTRY}
