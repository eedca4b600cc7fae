"""ops.check_archs without cuobjdump or nvcc: list conversions, listing parsing, and the CLI's verdict
and record, with a stand-in cuobjdump replaying what the real one printed for `nox -s cuda_compile`."""
from __future__ import annotations

import json
import stat

import pytest

from lab import docker, matrix
from ops import check_archs

# cuobjdump 13.2 on the extension built by `nox -s cuda_compile` (cuda13.0: 8.0 8.6 8.9 9.0 10.0 12.0+PTX).
# Each architecture shows twice: the extension has two .cu files, each with its own fatbinary.
EXT_ELF = """\
ELF file    1: myops_swish.1.sm_100.cubin
ELF file    2: myops_swish.2.sm_120.cubin
ELF file    3: myops_swish.3.sm_80.cubin
ELF file    4: myops_swish.4.sm_86.cubin
ELF file    5: myops_swish.5.sm_89.cubin
ELF file    6: myops_swish.6.sm_90.cubin
ELF file    7: myops_swish.7.sm_100.cubin
ELF file    8: myops_swish.8.sm_120.cubin
ELF file    9: myops_swish.9.sm_80.cubin
ELF file   10: myops_swish.10.sm_86.cubin
ELF file   11: myops_swish.11.sm_89.cubin
ELF file   12: myops_swish.12.sm_90.cubin
"""
EXT_PTX = """\
PTX file    1: myops_swish.1.sm_120.ptx
PTX file    2: myops_swish.2.sm_120.ptx
"""
# ... and on the plugin built with CMAKE_CUDA_ARCHITECTURES=80-real;86-real;89-real;90-real;100-real;120.
PLUGIN_ELF = """\
ELF file    1: libmyops_ort.1.sm_80.cubin
ELF file    2: libmyops_ort.2.sm_86.cubin
ELF file    3: libmyops_ort.3.sm_89.cubin
ELF file    4: libmyops_ort.4.sm_90.cubin
ELF file    5: libmyops_ort.5.sm_100.cubin
ELF file    6: libmyops_ort.6.sm_120.cubin
"""
PLUGIN_PTX = "PTX file    1: libmyops_ort.1.sm_120.ptx\n"
CUDA13 = {"sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120", "compute_120"}


def test_torch_and_cmake_lists_expand_alike():
    assert check_archs.expected_archs("8.0 8.6 9.0+PTX") == {"sm_80", "sm_86", "sm_90", "compute_90"}
    assert check_archs.expected_archs("8.0;8.6;9.0+PTX") == check_archs.expected_archs("80-real;86-real;90")
    assert check_archs.expected_archs("90a-real 120-virtual") == {"sm_90a", "compute_120"}
    assert check_archs.expected_archs("9.0a") == {"sm_90a"}


def test_every_cuda_entry_means_the_same_to_both_builds():
    # The plugin gets lab.docker's CMake translation of the list the extension gets as-is.
    for name, entry in matrix.load()["entries"].items():
        archs = entry["torch_cuda_arch_list"]
        if entry["device"] == "cuda":
            cmake = docker.cmake_cuda_architectures(archs)
            assert check_archs.expected_archs(" ".join(archs)) == check_archs.expected_archs(cmake), name


@pytest.mark.parametrize("item", ["Ampere", "sm_80", "8", "8.6+ptx"])
def test_unknown_items_are_refused(item):
    with pytest.raises(ValueError, match=item.replace("+", r"\+")):
        check_archs.expected_archs(item)


def test_real_listings_parse_to_the_requested_archs():
    assert check_archs.parse_listing(EXT_ELF, EXT_PTX) == CUDA13
    assert check_archs.parse_listing(PLUGIN_ELF, PLUGIN_PTX) == CUDA13
    assert check_archs.expected_archs("8.0 8.6 8.9 9.0 10.0 12.0+PTX") == CUDA13
    assert check_archs.parse_listing("", "") == set()


def test_compare_names_missing_and_extra():
    assert check_archs.compare(CUDA13, CUDA13) is None
    problem = check_archs.compare(CUDA13, check_archs.expected_archs("8.0 8.6 8.9 9.0+PTX"))
    assert problem == "missing ['compute_90'], extra ['compute_120', 'sm_100', 'sm_120']"


@pytest.fixture
def plugin_build(tmp_path):
    """A plugin build dir with its build_info.json, and a cuobjdump stand-in replaying PLUGIN_*."""
    (tmp_path / "elf.txt").write_text(PLUGIN_ELF)
    (tmp_path / "ptx.txt").write_text(PLUGIN_PTX)
    tool = tmp_path / "cuobjdump"
    tool.write_text(f'#!/bin/sh\n[ "$1" = --list-elf ] && exec cat {tmp_path}/elf.txt\nexec cat {tmp_path}/ptx.txt\n')
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    library = tmp_path / "libmyops_ort.so"
    library.write_bytes(b"")
    info = tmp_path / "build_info.json"
    info.write_text(json.dumps({"library": str(library), "with_cuda": True,
                                "cuda_architectures": "80-real;86-real;89-real;90-real;100-real;120"}))
    return tool, info


def test_cli_passes_and_records_what_it_found(plugin_build, capsys):
    tool, info = plugin_build
    assert check_archs.main(["--build-info", str(info), "--cuobjdump", str(tool)]) == 0
    assert json.loads(info.read_text())["cuda_archs_found"] == sorted(CUDA13)
    assert "as '80-real" in capsys.readouterr().out


def test_cli_fails_on_a_wrong_list_naming_the_difference(plugin_build, capsys):
    tool, info = plugin_build
    args = ["--build-info", str(info), "--cuobjdump", str(tool), "--arch-list", "8.0 8.6 9.0+PTX"]
    assert check_archs.main(args) == 1
    err = capsys.readouterr().err
    assert "missing ['compute_90'], extra ['compute_120', 'sm_100', 'sm_120', 'sm_89']" in err
    # What the binary holds is recorded whatever the verdict.
    assert json.loads(info.read_text())["cuda_archs_found"] == sorted(CUDA13)


def test_cli_finds_the_library_beside_its_build_info(plugin_build):
    tool, info = plugin_build
    library = info.parent / "libmyops_ort.so"
    assert check_archs.main(["--library", str(library), "--cuobjdump", str(tool)]) == 0
