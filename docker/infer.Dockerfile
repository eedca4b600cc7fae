# The inference side of one matrix entry, meant to be pulled onto a (GPU) host: onnxruntime(-gpu)
# with NVIDIA's CUDA libraries from wheels, numpy, the plugin (installed from its wheel), the
# artifacts and the torch-free runner. NO PyTorch in the final stage.
#   docker run --rm [--gpus all] <image> verify | dump --out DIR | bench
# Labels (OCI source, revision, version, created, matrix entry) come from build args lab/docker.py fills.
ARG BASE_BUILD
ARG BASE_RUNTIME
ARG TRAIN_IMAGE

# The plugin, built as its wheel (wheels/myops_ort, staged into plugin-wheel/ by lab/wheel_stage.py) by
# scikit-build-core from the plugin lock, against the pinned ORT headers only (no torch in this stage).
# First, so that `--target plugin` (nox -s wheels for a CUDA entry) builds nothing else.
FROM ${BASE_BUILD} AS plugin
ARG PYTHON_VERSION
COPY scripts/ /opt/myops-scripts/
RUN sh /opt/myops-scripts/ensure_python.sh "${PYTHON_VERSION}" build
COPY toolkit/ /opt/myops-toolkit/
RUN sh /opt/myops-scripts/use_toolkit.sh
ENV PATH=/usr/local/cuda/bin:$PATH CUDA_HOME=/usr/local/cuda
COPY locks/plugin.txt /opt/myops-locks/plugin.txt
ARG WHEELS
RUN "python${PYTHON_VERSION}" -m venv /opt/wheel-build \
 && /opt/wheel-build/bin/pip install --no-cache-dir --no-index --find-links "${WHEELS}" --require-hashes \
        -r /opt/myops-locks/plugin.txt
COPY plugin-wheel/ /plugin-wheel/
ARG CUDA_MODE=OFF CUDA_ARCHITECTURES=""
# Another architecture's image: the cross compiler's CMake settings and the wheel's platform tag
# (lab/docker.py fills them).
ARG PLUGIN_CMAKE_ARGS="" PLUGIN_WHEEL_PLATFORM=""
# A fixed date in the wheel's zip (else each file's mtime, which differs per checkout); not the
# commit's, so a commit that changes no plugin source reuses this step.
RUN SOURCE_DATE_EPOCH=315532800 CMAKE_ARGS="-DMYOPS_CUDA=${CUDA_MODE} ${PLUGIN_CMAKE_ARGS} \
        -DORT_INCLUDE_DIR=$(dirname "$(ls /plugin-wheel/headers/ort/*/include/onnxruntime_c_api.h)") \
        ${CUDA_ARCHITECTURES:+-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES}}" \
    env ${PLUGIN_WHEEL_PLATFORM:+_PYTHON_HOST_PLATFORM=${PLUGIN_WHEEL_PLATFORM}} \
    /opt/wheel-build/bin/pip wheel --no-cache-dir --no-build-isolation --no-deps --no-index --wheel-dir /wheels \
        --config-settings=build-dir=/build /plugin-wheel \
 && ls /wheels/myops_ort*.whl

FROM ${TRAIN_IMAGE} AS artifacts

FROM ${BASE_RUNTIME} AS infer
ARG PYTHON_VERSION
COPY scripts/ /opt/myops-scripts/
RUN sh /opt/myops-scripts/ensure_python.sh "${PYTHON_VERSION}"
RUN useradd --create-home --uid 10001 lab
# The locked packages in a virtualenv, read from the wheel server lab/docker.py runs for the build
# on 127.0.0.1 (hashes checked): the wheels never land in a layer.
COPY locks/ /opt/myops-locks/
ARG WHEELS
RUN "python${PYTHON_VERSION}" -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --no-index --find-links "${WHEELS}" --require-hashes -r /opt/myops-locks/infer.txt
ARG NUMPY_VERSION ORT_PACKAGE ORT_VERSION
RUN /opt/venv/bin/python /opt/myops-locks/check_versions.py python=${PYTHON_VERSION} numpy=${NUMPY_VERSION} \
        ${ORT_PACKAGE}=${ORT_VERSION}
# NVIDIA's libraries from the wheels are found the way system libraries are (by ldconfig's cache),
# so onnxruntime's CUDA provider loads them in any process, and ldd can show it without a GPU.
RUN /opt/venv/bin/python /opt/myops-scripts/cuda_wheel_libs.py > /etc/ld.so.conf.d/myops-cuda-wheels.conf && ldconfig
ARG ENTRY
# The plugin as pip installed it from its wheel (lab/docker.py's installed_plugin names the same path).
ENV PATH=/opt/venv/bin:$PATH PYTHONPATH=/opt/myops/app \
    MYOPS_ORT_PLUGIN=/opt/venv/lib/python${PYTHON_VERSION}/site-packages/myops_ort/libmyops_ort.so \
    MYOPS_ARTIFACTS=/opt/myops/artifacts MYOPS_MATRIX_ENTRY=${ENTRY}
ENTRYPOINT ["python", "-m", "infer.runner"]
CMD ["verify"]
# The wheel stays in the image (docker cp takes it out) and is what pip installs: no bytecode, so the
# installed files are the wheel's own.
COPY --from=plugin /wheels/ /opt/myops/wheels/
RUN pip install --no-cache-dir --no-index --no-deps --no-compile /opt/myops/wheels/myops_ort*.whl
COPY --from=artifacts /lab/artifacts /opt/myops/artifacts
COPY app/ /opt/myops/app/
# Modes made the same whatever the checkout's umask, then every file's sha256, mode and owner
# recorded: two builds of one commit can be shown equal, and `verify` checks it first.
ENV MYOPS_CONTENTS=/opt/myops/CONTENTS
RUN chmod -R u=rwX,go=rX /opt/myops && python -B -m ort_plugin.contents write /opt/myops \
        "$(dirname "${MYOPS_ORT_PLUGIN}")" "$(dirname "${MYOPS_ORT_PLUGIN}")"*.dist-info
USER lab
# Labels last: the revision changes with every commit, and an ARG in scope of a RUN is part of its cache key.
ARG REVISION=unknown VERSION CREATED IMAGE TORCH_CUDA_ARCH_LIST="" TOOLKIT=""
ENV MYOPS_GIT_SHA=${REVISION} MYOPS_IMAGE=${IMAGE}
LABEL org.opencontainers.image.title="myops-lab infer (${ENTRY})" org.opencontainers.image.source=myops-lab \
      org.opencontainers.image.revision=${REVISION} org.opencontainers.image.version=${VERSION} \
      org.opencontainers.image.created=${CREATED} lab.matrix.entry=${ENTRY} \
      lab.cuda.archs="${TORCH_CUDA_ARCH_LIST}" lab.cuda.toolkit="${TOOLKIT}"
