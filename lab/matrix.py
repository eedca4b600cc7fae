"""Load and validate matrix.yaml: `python -m lab.matrix [ENTRY]` prints it or one entry.

Errors name the entry and the field: "matrix.yaml: entry 'cpu', field 'onnxruntime.version': ...".
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

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


def _semantic_problems(entries: dict) -> list[str]:
    """What a schema cannot say: pairings that must agree with each other."""
    problems = []
    for name, entry in entries.items():
        cuda = entry["device"] == "cuda"
        if cuda and "cuda" not in entry:
            problems.append(f"entry '{name}', field 'cuda': a cuda entry must pin its CUDA version")
        if cuda and not entry["torch_cuda_arch_list"]:
            problems.append(f"entry '{name}', field 'torch_cuda_arch_list': a cuda entry needs target architectures")
        if not cuda and entry["torch_cuda_arch_list"]:
            problems.append(f"entry '{name}', field 'torch_cuda_arch_list': must be empty for a cpu entry")
        if cuda != (entry["onnxruntime"]["package"] == "onnxruntime-gpu"):
            problems.append(f"entry '{name}', field 'onnxruntime.package': use onnxruntime-gpu exactly for cuda entries")
        if ("CUDAExecutionProvider" in entry["execution_providers"]) != cuda:
            problems.append(f"entry '{name}', field 'execution_providers': CUDAExecutionProvider exactly for cuda entries")
        ort_minor = int(entry["onnxruntime"]["version"].split(".")[1])
        headers_minor = int(entry["ort_headers"]["version"].split(".")[1])
        if headers_minor > ort_minor:
            problems.append(f"entry '{name}', field 'ort_headers.version': headers {entry['ort_headers']['version']} are newer "
                            f"than onnxruntime {entry['onnxruntime']['version']}; the plugin would not load")
        for opset in entry["opsets"]:
            # ORT's documented floor: opset 17 needs 1.13, 18 needs 1.14, 19 needs 1.15, 20 needs 1.17, 21 needs 1.20
            needed = {17: 13, 18: 14, 19: 15, 20: 17, 21: 20}.get(opset) if isinstance(opset, int) else None
            if needed and ort_minor < needed:
                problems.append(f"entry '{name}', field 'opsets': opset {opset} needs onnxruntime >= 1.{needed}")
    return problems


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


def pip_pins(e: dict) -> list[str]:
    """The Python packages of an entry, as pip requirement strings."""
    ort = e["onnxruntime"]
    return [f"torch=={e['torch']['version']}", f"onnx=={e['onnx']}", f"onnxscript=={e['onnxscript']}",
            f"numpy=={e['numpy']}", f"{ort['package']}=={ort['version']}"]


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
