"""The compiled part of the myops-torch wheel, built in a stage that lab/dist.py assembles (csrc/,
kernels/, the package) against the torch of the interpreter that runs it: the wheel's version label,
its torch requirement and myops_torch/build.json all come from that torch."""
import json
import os
import sys
from pathlib import Path

import torch
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

HERE = Path(__file__).resolve().parent
if not (HERE / "build_config.json").exists():
    sys.exit("this folder is built from a stage that lab/dist.py assembles (sources, kernels, the ops' Python): "
             "run `nox -s wheels -- ENTRY`")
config = json.loads((HERE / "build_config.json").read_text())  # lab/dist.py: the lab's version, include dirs
if torch.version.cuda and os.environ.get("MYOPS_NO_CUDA") != "1":
    sys.exit("myops-torch wheels are built for the CPU only so far: set MYOPS_NO_CUDA=1 to build the CPU kernels "
             "against this CUDA torch")

release = torch.__version__.split("+")[0]
facts = {"torch": release, "torch_cuda": None, "cxx11_abi": int(torch._C._GLIBCXX_USE_CXX11_ABI)}
version = f"{config['version']}+torch{release}.cpu"
(HERE / "myops_torch" / "build.json").write_text(json.dumps({"version": version, "entry": config["entry"], **facts},
                                                            indent=2, sort_keys=True) + "\n")

# As ops/build.py: -fopenmp where ATen's parallel backend is OpenMP (else at::parallel_for runs on one thread).
backend = torch.__config__.parallel_info().split("ATen parallel backend:")[-1].splitlines()[0]
openmp = ["-fopenmp"] if "OpenMP" in backend else []
# No folder of this machine in the binary (__FILE__ in torch's checks): the same bytes from any clone or venv.
site_packages = Path(torch.__file__).resolve().parent.parent
path_free = [f"-ffile-prefix-map={HERE}=.", f"-ffile-prefix-map={site_packages}=site-packages"]

extension = CppExtension(
    "myops_torch._myops",
    sources=sorted(str(p.relative_to(HERE)) for p in (HERE / "csrc").glob("*.cpp")),
    include_dirs=config["include_dirs"],
    extra_compile_args=["-O3", *openmp, *path_free],
    # --discard-all: no local symbols, so two builds of the same sources give the same bytes
    extra_link_args=[*openmp, "-Wl,--discard-all"],
)

setup(
    version=version,
    install_requires=[f"torch=={release}"],
    ext_modules=[extension],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=False)},
)
