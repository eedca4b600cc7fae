"""Write the artifacts the inference side runs: ONNX files, fixed inputs, PyTorch reference outputs.

    python -m ops.artifacts --out build/artifacts [--entry cpu]

For every model of every op (ops.registry: swish, ffn, rms_norm...), lowering, exporter and opset of the
entry: the ONNX file; per model one input (the seed its op declares, so every machine gets the same
numbers) and the PyTorch model's output on it. manifest.json lists every file with its sha256, so a consumer can refuse a damaged file.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import torch

from . import export as E
from .registry import MODEL_OP, OPS

INPUT_SHAPE = (3, 7, 768)  # differs from the export shape on purpose: dynamic axes are exercised
MANIFEST = "manifest.json"


def save_npz(path: Path, **arrays) -> None:
    """np.savez with a fixed date in every member (np.savez stamps the current time): the same arrays
    give the same bytes on every build."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, array in arrays.items():
            member = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            member.external_attr = 0o644 << 16
            data = io.BytesIO()
            np.lib.format.write_array(data, np.asanyarray(array), allow_pickle=False)
            # Whole bytes, not a stream: how zipfile streams (zip64 headers) changed within Python 3.11.
            archive.writestr(member, data.getvalue())


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def write(out: Path, *, exporters, opsets, log=print) -> dict:
    """Build everything in a scratch dir, then move it into place: `out` is never half-written."""
    from . import load

    load()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}-") as tmp:
        staging = Path(tmp) / "artifacts"
        staging.mkdir()
        manifest = {"format": 1, "torch": torch.__version__, "models": [], "files": {}}
        for model_name in E.MODELS:
            op = OPS[MODEL_OP[model_name]]
            attributes = op.attributes(**op.artifact_attributes.get(model_name, {}))
            if model_name not in op.artifact_seeds:
                raise E.ExportError(f"op {op.name!r} has no artifact seed for the model {model_name!r}: declare one "
                                    f"in opspec/{op.name}.py (artifact_seeds=)")
            generator = torch.Generator().manual_seed(op.artifact_seeds[model_name])
            # one tensor per graph input, drawn in order from the op's seed (x alone for most models)
            feed = {name: torch.randn(*INPUT_SHAPE, generator=generator) for name in E.model_inputs(model_name)}
            with torch.no_grad():
                outputs = E.build_model(model_name, **attributes)(*feed.values())
            outputs = tuple(outputs) if isinstance(outputs, (tuple, list)) else (outputs,)
            inputs, reference = f"inputs-{model_name}.npz", f"reference-{model_name}.npz"
            save_npz(staging / inputs, **{name: t.numpy() for name, t in feed.items()})
            save_npz(staging / reference, **{name: t.numpy() for name, t in zip(E.model_outputs(model_name), outputs,
                                                                                 strict=True)})
            for exporter in exporters:
                for opset in opsets(exporter):
                    for lowering in E.LOWERINGS:
                        name = f"{model_name}-{lowering}-{exporter}-opset{opset}.onnx"
                        result = E.export(model_name, exporter=exporter, lowering=lowering, opset=opset,
                                          attributes=attributes, path=staging / name)
                        log(f"[artifacts] {name}: {result.graph}")
                        manifest["models"].append({"file": name, "model": model_name, "op": result.op, "lowering": lowering,
                                                   "exporter": exporter, "opset": opset, **attributes,
                                                   "inputs": inputs, "reference": reference})
        for path in sorted(staging.iterdir()):
            manifest["files"][path.name] = sha256(path)
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.artifacts", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=E.REPO / "build" / "artifacts")
    parser.add_argument("--entry", default=None, help="matrix entry whose exporters/opsets to use (default: cpu)")
    args = parser.parse_args(argv)
    from lab.matrix import DEFAULT_ENTRY, entry

    spec = entry(args.entry or DEFAULT_ENTRY)

    def opsets(exporter):
        return sorted({o if o != "newest" else E.newest_opset(exporter) for o in spec["opsets"]})

    try:
        manifest = write(args.out, exporters=spec["exporters"], opsets=opsets)
    except E.ExportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"[artifacts] {len(manifest['models'])} models in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
