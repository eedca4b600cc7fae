"""matrix.yaml: the committed file is valid, and each kind of mistake is one error naming entry and field."""
from __future__ import annotations

import copy

import pytest
import yaml

from lab import matrix

REQUIRED_IDS = {"cpu", "cuda11.8", "cuda12.1", "cuda12.4", "cuda12.8", "cuda13.0"}


def test_committed_matrix_is_valid_and_complete():
    entries = matrix.load()["entries"]
    assert REQUIRED_IDS <= set(entries)
    assert entries["cpu"]["device"] == "cpu" and not entries["cpu"]["torch_cuda_arch_list"]
    for name, entry in entries.items():
        if entry["device"] == "cuda":
            assert "9.0" in " ".join(entry["torch_cuda_arch_list"]), name


def _write(tmp_path, mutate):
    data = yaml.safe_load(matrix.MATRIX.read_text())
    broken = copy.deepcopy(data)
    mutate(broken["entries"])
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump(broken))
    return path


def _set(entry: dict, path: str, value) -> None:
    *parents, leaf = path.split(".")
    for key in parents:
        entry = entry[key]
    entry[leaf] = value


@pytest.mark.parametrize("mutate,expected", [
    (lambda e: e["cpu"].update(torch_version="2.13.0"), "entry 'cpu', field '(the entry itself)': Additional properties"),
    (lambda e: e["cuda12.1"].pop("onnxruntime"), "entry 'cuda12.1', field '(the entry itself)': 'onnxruntime' is a required"),
    (lambda e: e["cuda12.4"].update(opsets=[17, 99]), "entry 'cuda12.4', field 'opsets.1'"),
    (lambda e: e["cuda12.8"].update(torch_cuda_arch_list=["sm90"]), "entry 'cuda12.8', field 'torch_cuda_arch_list.0'"),
    (lambda e: e["cpu"]["onnxruntime"].update(package="onnxruntime-gpu"), "entry 'cpu', field 'onnxruntime.package'"),
    (lambda e: e["cuda11.8"]["onnxruntime"].update(version="1.12.0"), "opset 17 needs onnxruntime >= 1.13"),
])
def test_mistakes_name_the_entry_and_field(tmp_path, mutate, expected):
    with pytest.raises(matrix.MatrixError) as info:
        matrix.load(_write(tmp_path, mutate))
    assert expected in str(info.value), str(info.value)


# One planted mistake per compatibility check; each error names the entry, the field and the fix.
PLANTED = {
    "cudnn-torch": ("cuda12.1", {"torch.version": "2.3.1"},
                    "entry 'cuda12.1', field 'cudnn': torch 2.3.1 from PyPI bundles cuDNN 8, the entry says 9: pin a torch"),
    "cudnn-ort-feed": ("cuda12.1", {"onnxruntime.version": "1.18.0",
                                    "onnxruntime.index": "https://aiinfra.pkgs.visualstudio.com/PublicPackages/_packaging/onnxruntime-cuda-12/pypi/simple/"},
                       "field 'onnxruntime.version': onnxruntime-gpu 1.18.0 from https://aiinfra"),
    # the pairing this matrix used to have: the CUDA-12 feed's 1.18.1 needs cuDNN 9, torch 2.3.1 bundles 8
    "cudnn-old-cuda12.1": ("cuda12.1", {"cudnn": 8, "torch.version": "2.3.1", "onnxruntime.version": "1.18.1",
                                        "onnxruntime.index": "https://aiinfra.pkgs.visualstudio.com/PublicPackages/_packaging/onnxruntime-cuda-12/pypi/simple/"},
                           "needs cuDNN 9, the entry is cuDNN 8: its CUDA provider would not load"),
    "cuda-major-ort": ("cuda12.1", {"onnxruntime.version": "1.18.1"},
                       "onnxruntime-gpu 1.18.1 from PyPI is a CUDA 11 build, the entry is CUDA 12.1: pin a CUDA 12 build"),
    "cuda-major-ort-13": ("cuda13.0", {"onnxruntime.version": "1.24.1"},
                          "onnxruntime-gpu 1.24.1 from PyPI is a CUDA 12 build, the entry is CUDA 13.0"),
    "cuda-torch-build": ("cuda12.1", {"torch.version": "2.5.1"},
                         "field 'torch.version': torch 2.5.1 from PyPI is a CUDA 12.4 build, not 12.1: pin a torch"),
    "cuda-torch-index": ("cuda11.8", {"torch.version": "2.3.1+cu121"}, "torch 2.3.1+cu121 is a CUDA 12.1 build, not 11.8"),
    "toolkit-major": ("cuda12.4", {"toolkit.suite": "bookworm", "toolkit.version": "11.8.89~11.8.0-5~deb12u1"},
                      "field 'toolkit.version': nvcc 11.8 is CUDA 11, the entry is CUDA 12.4"),
    "numpy2": ("cuda11.8", {"numpy": "2.1.3"}, "field 'numpy': onnxruntime 1.18.1 was built against numpy 1.x"),
    "python-os": ("cuda12.4", {"python": "3.12"},
                  "field 'base_images.build': myops-lab/bookworm-build:1 is Debian 12 bookworm, whose Python is 3.11"),
    "python-ubuntu": ("cuda12.4", {"base_images.runtime": {"tag": "nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04"}},
                      "nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04 is Ubuntu 22.04, whose Python is 3.10"),
    "exporter": ("cuda12.1", {"exporters": ["torchscript", "dynamo"]},
                 "field 'exporters': torch 2.4.1 cannot run the dynamo exporter with the myops translation (needs torch >= 2.6)"),
    "opset-ort": ("cuda12.1", {"opsets": [17, 23]}, "field 'opsets': opset 23 needs onnxruntime >= 1.23"),
    "opset-past-table": ("cuda13.0", {"opsets": [17, 30]}, "onnxruntime 1.27.0 runs opsets up to 26; drop 30"),
    "headers-newer": ("cuda11.8", {"ort_headers.version": "1.21.0"}, "field 'ort_headers.version': headers 1.21.0 are newer"),
    "headers-archive": ("cuda12.4", {"ort_headers.version": "1.20.0"},
                        "field 'ort_headers.archive.url': the archive is not onnxruntime 1.20.0's release archive"),
    "headers-debian": ("cuda12.4", {"ort_headers.debian.version": "1.20.1+dfsg-1"},
                       "field 'ort_headers.debian.version': Debian package 1.20.1+dfsg-1 does not carry onnxruntime 1.21.0"),
    "arch-new": ("cuda12.4", {"torch_cuda_arch_list": ["8.0", "10.0+PTX"]},
                 "field 'torch_cuda_arch_list': 10.0+PTX: sm_100 needs CUDA 12.8 or later"),
    "arch-dropped": ("cuda13.0", {"torch_cuda_arch_list": ["7.0", "9.0+PTX"]},
                     "7.0: CUDA 13 no longer targets sm_70 (its oldest is sm_75)"),
    "torch-floor": ("cuda12.1", {"torch.version": "2.2.2"}, "field 'torch.version': torch 2.2.2 lacks what ops/adapters.py"),
    "no-cudnn": ("cuda12.4", {"cudnn": None}, "entry 'cuda12.4', field 'cudnn': a cuda entry must pin its cudnn"),
    "arm64-gpu": ("cuda12.4", {"infer_platforms": ["amd64", "arm64"]},
                  "field 'infer_platforms': arm64: onnxruntime-gpu has no Linux aarch64 wheels on PyPI; remove arm64"),
    "arm64-old-ort": ("cpu", {"onnxruntime.version": "1.9.0"},
                      "field 'infer_platforms': arm64: onnxruntime 1.9.0 has no Linux aarch64 wheel (they start at 1.10)"),
    "arm64-first": ("cpu", {"infer_platforms": ["arm64", "amd64"]}, "field 'infer_platforms': amd64 comes first"),
    # the pin this entry used to have: PyPI's torch 2.13.0 for x86-64 is a CUDA build
    "cpu-torch-from-pypi": ("cpu", {"torch": {"version": "2.13.0", "index": None}},
                            "entry 'cpu', field 'torch.index': torch 2.13.0 from PyPI is a CUDA 13.0 build (several GB "
                            "with its NVIDIA wheels) for a CPU entry: set torch.index to https://download.pytorch.org/whl/cpu"),
    "cpu-torch-cuda-build": ("cpu", {"torch": {"version": "2.3.1+cu118", "index": "https://download.pytorch.org/whl/cu118"}},
                             "entry 'cpu', field 'torch.version': torch 2.3.1+cu118 is a CUDA build"),
}


@pytest.mark.parametrize("check", sorted(PLANTED))
def test_planted_incompatibility_is_refused_with_its_fix(tmp_path, check):
    name, changes, expected = PLANTED[check]

    def mutate(entries):
        for path, value in changes.items():
            if value is None:
                entries[name].pop(path)
            else:
                _set(entries[name], path, value)

    with pytest.raises(matrix.MatrixError) as info:
        matrix.load(_write(tmp_path, mutate))
    assert expected in str(info.value), str(info.value)


def test_build_archs_leave_out_what_the_toolkit_cannot_target():
    kept, dropped = matrix.build_archs(matrix.entry("cuda12.8"))  # Debian's nvcc 12.4
    assert kept == ["8.0", "8.6", "8.9", "9.0+PTX"], kept
    assert [d.split()[0] for d in dropped] == ["10.0", "12.0+PTX"] and "needs CUDA 12.8" in dropped[0]
    assert matrix.build_archs(matrix.entry("cuda13.0")) == (matrix.entry("cuda13.0")["torch_cuda_arch_list"], [])


def test_broken_yaml_and_unknown_entry(tmp_path):
    path = tmp_path / "matrix.yaml"
    path.write_text("entries: [unclosed\n")
    with pytest.raises(matrix.MatrixError, match="not valid YAML"):
        matrix.load(path)
    with pytest.raises(matrix.MatrixError, match="no entry 'cuda99' in matrix.yaml; entries: cpu, cuda11.8"):
        matrix.entry("cuda99")


def test_fp32_exact_ort_settings_follow_the_release():
    """use_tf32 from 1.18 (measured in the wheels); before it the option would be refused, so the environment."""
    from lab.compat import ort_fp32_exact

    assert ort_fp32_exact("1.18.0") == ({"use_tf32": "0"}, {})
    assert ort_fp32_exact("1.27.0") == ({"use_tf32": "0"}, {})
    assert ort_fp32_exact("1.17.1") == ({}, {"NVIDIA_TF32_OVERRIDE": "0"})


def test_extension_standard_follows_torch_and_nvcc():
    from lab.compat import extension_cxx_standard

    assert extension_cxx_standard("2.3.1+cu118", "11.8") == "c++17"  # the cuda11.8 entry: nvcc 11.8 has no C++20
    assert extension_cxx_standard("2.11.0", "13.0") == "c++17"
    assert extension_cxx_standard("2.13.0+cpu") == "c++20"
    with pytest.raises(ValueError, match="nvcc 11.8 cannot compile.*CUDA 12.0 or later"):
        extension_cxx_standard("2.13.0", "11.8")
