"""Load and validate matrix.yaml: `python -m lab.matrix [ENTRY]` prints it or one entry.

Errors name the entry and the field: "matrix.yaml: entry 'cpu', field 'onnxruntime.version': ...".
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from . import compat

REPO = Path(__file__).resolve().parent.parent
MATRIX = REPO / "matrix.yaml"
SCHEMA = Path(__file__).resolve().parent / "matrix.schema.json"
DEFAULT_ENTRY = "cpu"


class MatrixError(ValueError):
    pass


def _where(error) -> str:
    path = list(error.absolute_path)
    if len(path) >= 2 and path[0] == "entries":
        field = ".".join(str(p) for p in path[2:]) or "(the entry itself)"
        return f"entry '{path[1]}', field '{field}'"
    return "top level" if not path else "field '" + ".".join(str(p) for p in path) + "'"


def _problem(name: str, field: str, text: str) -> str:
    return f"entry '{name}', field '{field}': {text}"


def _semantic_problems(entries: dict) -> list[str]:
    """What a schema cannot say: pairings that must agree with each other (facts in lab.compat)."""
    problems = []
    for name, entry in entries.items():
        problems += _shape_problems(name, entry)
        problems += _version_problems(name, entry)
        if entry["device"] == "cuda" and all(k in entry for k in ("cuda", "cudnn", "toolkit")):
            problems += _cuda_problems(name, entry)
        if entry["device"] == "cpu":
            problems += _cpu_torch_problems(name, entry)
    return problems


def _cpu_torch_problems(name: str, entry: dict) -> list[str]:
    """A CPU entry's torch must be a CPU build: from PyPI, x86-64 torch is a CUDA build (lab.compat)."""
    torch_v, index = entry["torch"]["version"], entry["torch"]["index"]
    build = compat.torch_cuda_build(torch_v)
    if index is None and build is not None:
        return [_problem(name, "torch.index", f"torch {torch_v} from PyPI is a CUDA {build.cuda} build (several GB with "
                         f"its NVIDIA wheels) for a CPU entry: set torch.index to {compat.TORCH_CPU_INDEX}")]
    if build is not None and compat.local_cuda(torch_v):
        return [_problem(name, "torch.version", f"torch {torch_v} is a CUDA build: pin a CPU build for a CPU entry")]
    return []


def _shape_problems(name: str, entry: dict) -> list[str]:
    problems = []
    cuda = entry["device"] == "cuda"
    for needed in ("cuda", "cudnn", "toolkit"):
        if cuda and needed not in entry:
            problems.append(_problem(name, needed, f"a cuda entry must pin its {needed}"))
        if not cuda and needed in entry:
            problems.append(_problem(name, needed, "only cuda entries have one; remove it"))
    if cuda and not entry["torch_cuda_arch_list"]:
        problems.append(_problem(name, "torch_cuda_arch_list", "a cuda entry needs target architectures"))
    if not cuda and entry["torch_cuda_arch_list"]:
        problems.append(_problem(name, "torch_cuda_arch_list", "must be empty for a cpu entry"))
    platforms = entry.get("infer_platforms", ["amd64"])
    if platforms[0] != "amd64":
        problems.append(_problem(name, "infer_platforms", "amd64 comes first (the train image and the artifacts are amd64)"))
    if "arm64" in platforms:
        why = compat.arm64_problem(entry["onnxruntime"]["package"], entry["onnxruntime"]["version"], entry["numpy"])
        if why:
            problems.append(_problem(name, "infer_platforms", f"arm64: {why}; remove arm64"))
    if cuda != (entry["onnxruntime"]["package"] == "onnxruntime-gpu"):
        problems.append(_problem(name, "onnxruntime.package", "use onnxruntime-gpu exactly for cuda entries"))
    if ("CUDAExecutionProvider" in entry["execution_providers"]) != cuda:
        problems.append(_problem(name, "execution_providers", "CUDAExecutionProvider exactly for cuda entries"))
    return problems


def _version_problems(name: str, entry: dict) -> list[str]:
    problems = []
    torch_v, ort_v = entry["torch"]["version"], entry["onnxruntime"]["version"]
    if compat.release(torch_v) < compat.TORCH_FLOOR:
        problems.append(_problem(name, "torch.version", f"torch {torch_v} lacks what ops/adapters.py registers "
                                 f"the ops' fake kernels and autograd with: pin torch >= {compat.TORCH_FLOOR}"))
    unsupported = [e for e in entry["exporters"] if e not in compat.exporters_supported(torch_v)]
    for exporter in unsupported:
        floor = compat.EXPORTER_TORCH[exporter]
        problems.append(_problem(name, "exporters", f"torch {torch_v} cannot run the {exporter} exporter with the "
                                 f"myops translation (needs torch >= {floor}): remove '{exporter}' or pin a newer torch"))
    headers = entry["ort_headers"]
    if compat.release(headers["version"]) > compat.release(ort_v):
        problems.append(_problem(name, "ort_headers.version", f"headers {headers['version']} are newer than onnxruntime "
                                 f"{ort_v}; the plugin would not load: pin headers <= {ort_v}"))
    if f"/v{headers['version']}/" not in headers["archive"]["url"] or f"-{headers['version']}." not in headers["archive"]["url"]:
        problems.append(_problem(name, "ort_headers.archive.url", f"the archive is not onnxruntime {headers['version']}'s "
                                 f"release archive: use .../download/v{headers['version']}/onnxruntime-linux-x64-{headers['version']}.tgz"))
    debian = headers.get("debian")
    if debian and not re.match(re.escape(headers["version"]) + r"[+~-]", debian["version"]):
        problems.append(_problem(name, "ort_headers.debian.version", f"Debian package {debian['version']} does not carry "
                                 f"onnxruntime {headers['version']}: pin the package whose upstream version is {headers['version']}"))
    top = compat.ort_max_opset(ort_v)
    for opset in entry["opsets"]:
        if not isinstance(opset, int):
            continue
        needed = compat.ort_min_version_for_opset(opset)
        if needed and compat.release(ort_v) < compat.release(needed):
            problems.append(_problem(name, "opsets", f"opset {opset} needs onnxruntime >= {needed}"))
        elif top is not None and needed is None and opset > top:
            problems.append(_problem(name, "opsets", f"onnxruntime {ort_v} runs opsets up to {top}; drop {opset}"))
    if compat.release(ort_v) < compat.ORT_NUMPY2 and compat.release(entry["numpy"]).major >= 2:
        problems.append(_problem(name, "numpy", f"onnxruntime {ort_v} was built against numpy 1.x and does not import "
                                 "under numpy 2: pin numpy < 2 (e.g. 1.26.4)"))
    for role, image in entry["base_images"].items():
        base = compat.base_os(image)
        if base and base.python != entry["python"]:
            problems.append(_problem(name, f"base_images.{role}", f"{image['tag']} is {base.name}, whose Python is "
                                     f"{base.python}, but the entry pins python {entry['python']}: pin python "
                                     f"\"{base.python}\" or use a base with Python {entry['python']}"))
    return problems


def _cuda_problems(name: str, entry: dict) -> list[str]:
    """CUDA and cuDNN must agree across the entry, torch's build, onnxruntime's build and the toolkit."""
    problems = []
    cuda, cudnn = entry["cuda"], entry["cudnn"]
    major = compat.release(cuda).major
    torch_v = entry["torch"]["version"]
    torch_build = compat.torch_cuda_build(torch_v)
    if torch_build is None:
        problems.append(_problem(name, "torch.version", f"torch {torch_v} is not a CUDA build: pin a CUDA {cuda} build"))
    else:
        where = f"torch {torch_v}" + ("" if compat.local_cuda(torch_v) else " from PyPI")
        if torch_build.cuda != cuda:
            problems.append(_problem(name, "torch.version", f"{where} is a CUDA {torch_build.cuda} build, not {cuda}: "
                                     f"pin a torch whose build is CUDA {cuda} (a '+cu{cuda.replace('.', '')}' version "
                                     "with torch.index set to that index, or a PyPI release built for it)"))
        if torch_build.cudnn != cudnn:
            problems.append(_problem(name, "cudnn", f"{where} bundles cuDNN {torch_build.cudnn}, the entry says {cudnn}: "
                                     "pin a torch with the entry's cuDNN or change the entry's cudnn"))
    ort = entry["onnxruntime"]
    ort_build = compat.ort_cuda_build(ort["version"], ort["index"])
    if ort_build is not None:
        feed = f"from {ort['index']}" if ort["index"] else "from PyPI"
        if int(ort_build.cuda) != major:
            problems.append(_problem(name, "onnxruntime.version", f"onnxruntime-gpu {ort['version']} {feed} is a CUDA "
                                     f"{ort_build.cuda} build, the entry is CUDA {cuda}: pin a CUDA {major} build "
                                     "(by version, or its own feed as onnxruntime.index)"))
        if ort_build.cudnn != cudnn:
            problems.append(_problem(name, "onnxruntime.version", f"onnxruntime-gpu {ort['version']} {feed} needs cuDNN "
                                     f"{ort_build.cudnn}, the entry is cuDNN {cudnn}: its CUDA provider would not load; "
                                     f"pin a release built with cuDNN {cudnn}"))
    toolkit = entry["toolkit"]
    if toolkit["source"] == "debian" and not toolkit.get("suite"):
        problems.append(_problem(name, "toolkit.suite", "a Debian toolkit names its suite (bookworm: CUDA 11.8, "
                                 "trixie: 12.4)"))
    toolkit_cuda = toolkit_cuda_version(toolkit)
    if compat.release(toolkit_cuda).major != major:
        problems.append(_problem(name, "toolkit.version", f"nvcc {toolkit_cuda} is CUDA {compat.release(toolkit_cuda).major}, "
                                 f"the entry is CUDA {cuda}: torch refuses to build extensions across majors"))
    for item in entry["torch_cuda_arch_list"]:
        why = compat.arch_problem(item, cuda)
        if why:
            problems.append(_problem(name, "torch_cuda_arch_list", f"{item}: {why}; remove it or raise the entry's CUDA"))
    return problems


def toolkit_cuda_version(toolkit: dict) -> str:
    """The CUDA version of a toolkit pin: Debian '12.4.131~12.4.1-2' -> '12.4', wheels '13.0.2' -> '13.0'."""
    upstream = toolkit["version"].split("-")[0].split("~")[-1]  # Debian: <component>~<CUDA>-<revision>
    return ".".join(upstream.split(".")[:2])


def build_archs(entry: dict) -> tuple[list[str], list[str]]:
    """The architectures the entry's own toolkit can build here, and the ones it cannot (with why).

    An item the toolkit's nvcc cannot target is left out (said in the image's proof, never claimed);
    its PTX moves to the newest item kept, so later GPUs can still JIT the kernels.
    """
    cuda = toolkit_cuda_version(entry["toolkit"])
    kept, dropped = [], []
    for item in entry["torch_cuda_arch_list"]:
        why = compat.arch_problem(item, cuda)
        (dropped if why else kept).append(f"{item} ({why})" if why else item)
    if dropped and kept and not any(k.endswith("+PTX") for k in kept):
        kept[-1] += "+PTX"
    return kept, dropped


def load(path: Path = MATRIX) -> dict:
    """The validated matrix: {'entries': {id: entry}}."""
    import jsonschema
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError as exc:
        raise MatrixError(f"{path} not found") from exc
    except yaml.YAMLError as exc:
        raise MatrixError(f"{path}: not valid YAML: {exc}") from exc
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text()))
    errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        raise MatrixError(f"{Path(path).name}: {_where(first)}: {first.message}"
                          + (f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""))
    problems = _semantic_problems(data["entries"])
    if problems:
        raise MatrixError(f"{Path(path).name}: " + "; ".join(problems))
    return data


def entry(name: str, path: Path = MATRIX) -> dict:
    entries = load(path)["entries"]
    if name not in entries:
        raise MatrixError(f"no entry '{name}' in {Path(path).name}; entries: {', '.join(entries)}")
    return {"id": name, **entries[name]}


def pip_pins(e: dict, *, models: bool = False) -> list[str]:
    """The Python packages of an entry, as pip requirement strings; with models=True also its
    transformers (the whole-model runs and their tests: nox -s model, nox -s tests)."""
    ort = e["onnxruntime"]
    return [f"torch=={e['torch']['version']}", f"onnx=={e['onnx']}", f"onnxscript=={e['onnxscript']}",
            f"numpy=={e['numpy']}", f"{ort['package']}=={ort['version']}"] \
        + ([f"transformers=={e['transformers']}"] if models and e.get("transformers") else [])


def main(argv: list[str]) -> int:
    try:
        data = load()
        if argv:
            print(json.dumps(entry(argv[0]), indent=2))
            return 0
    except MatrixError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for name, e in data["entries"].items():
        print(f"{name:10} {e['device']:5} torch {e['torch']['version']:8} {e['onnxruntime']['package']} "
              f"{e['onnxruntime']['version']:7} opsets {e['opsets']} archs {e['torch_cuda_arch_list'] or '-'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
