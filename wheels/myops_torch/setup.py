"""The compiled part of the myops-torch wheel, built in a stage that lab/dist.py assembles (csrc/,
kernels/, the package) against the torch of the interpreter that runs it: the wheel's version label,
its torch requirement and myops_torch/build.json all come from that torch. A CUDA entry's stage
(build_config.json "cuda") adds the CUDA kernels, for TORCH_CUDA_ARCH_LIST's architectures; it is
built in the entry's train image, where the matching nvcc is."""
import json
import os
import sys
from pathlib import Path

import torch
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

HERE = Path(__file__).resolve().parent
if not (HERE / "build_config.json").exists():
    sys.exit("this folder is built from a stage that lab/dist.py assembles (sources, kernels, the ops' Python): "
             "run `nox -s wheels -- ENTRY`")
config = json.loads((HERE / "build_config.json").read_text())  # lab/dist.py: the lab's version, include dirs
cuda = bool(config.get("cuda"))
if cuda and not (torch.version.cuda and os.environ.get("TORCH_CUDA_ARCH_LIST")):
    sys.exit(f"this stage is for a CUDA entry ({config['entry']}) but torch {torch.__version__} is a CPU build or "
             "TORCH_CUDA_ARCH_LIST is unset: build it with `nox -s wheels -- ENTRY`, which runs the entry's train image")
if not cuda and torch.version.cuda and os.environ.get("MYOPS_NO_CUDA") != "1":
    sys.exit("this stage is for a CPU entry but torch is a CUDA build: set MYOPS_NO_CUDA=1 to build the CPU kernels "
             "against it")

release = torch.__version__.split("+")[0]
label = f"cu{torch.version.cuda.replace('.', '')}" if cuda else "cpu"  # +torch2.4.1.cu121, as torch labels itself
facts = {"torch": release, "torch_cuda": torch.version.cuda if cuda else None,
         "cxx11_abi": int(torch._C._GLIBCXX_USE_CXX11_ABI),
         "torch_cuda_arch_list": os.environ["TORCH_CUDA_ARCH_LIST"] if cuda else None}
version = f"{config['version']}+torch{release}.{label}"
(HERE / "myops_torch" / "build.json").write_text(json.dumps({"version": version, "entry": config["entry"], **facts},
                                                            indent=2, sort_keys=True) + "\n")

# As ops/build.py: -fopenmp where ATen's parallel backend is OpenMP (else at::parallel_for runs on one thread).
backend = torch.__config__.parallel_info().split("ATen parallel backend:")[-1].splitlines()[0]
openmp = ["-fopenmp"] if "OpenMP" in backend else []
# No folder of this machine in the binary (__FILE__ in torch's checks): the same bytes from any clone or venv.
site_packages = Path(torch.__file__).resolve().parent.parent
path_free = [f"-ffile-prefix-map={HERE}=.", f"-ffile-prefix-map={site_packages}=site-packages"]

# As ops/build.py: each declared op's few lines over the generic adapters, written here from the vendored
# catalogue (opspec.codegen), the hand-written adapters (csrc/*.cpp, csrc/cuda/*.cu) and the shared kernels
# (kernels/*_cuda.cu); setuptools names objects by their paths, so files of one name in two folders do not collide.
sys.path.insert(0, str(HERE / "myops_torch"))
from opspec import TORCH_OPS, codegen  # noqa: E402  (the vendored catalogue, found through the path above)

codegen.write_torch_sources(HERE / "csrc", HERE / "csrc" / "cuda")
sources = sorted(HERE.glob("csrc/*.cpp"))
if cuda:
    sources += sorted(HERE.glob("csrc/cuda/*.cu")) + sorted(
        path for path in HERE.glob("kernels/*_cuda.cu") if path.name[:-len("_cuda.cu")] in TORCH_OPS)
extension = (CUDAExtension if cuda else CppExtension)(
    "myops_torch._myops",
    sources=[str(p.relative_to(HERE)) for p in sources],
    include_dirs=config["include_dirs"],
    extra_compile_args={"cxx": ["-O3", *openmp, *path_free],
                        "nvcc": ["-O3", *[f for flag in path_free for f in ("-Xcompiler", flag)]]},
    # --discard-all: no local symbols (nvcc's host pass names a tmpxft_<pid> file), so two builds of the
    # same sources give the same bytes
    extra_link_args=[*openmp, "-Wl,--discard-all"],
)

setup(
    version=version,
    install_requires=[f"torch=={release}"],
    ext_modules=[extension],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=False)},
)
