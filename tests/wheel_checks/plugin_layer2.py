"""Run in a clean venv holding only onnxruntime, numpy and the myops-ort wheel (python -I: nothing of
the checkout on the path): every artifact of an artifacts folder through ONNX Runtime with the
installed plugin, against PyTorch's reference outputs. Then an onnxruntime too old for the library
must be refused with a message.   python -I plugin_layer2.py ARTIFACTS ATOL [GLOB]
(GLOB: only the artifacts whose file name matches it)"""
import fnmatch
import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

import myops_ort

artifacts, atol = Path(sys.argv[1]), float(sys.argv[2])
pattern = sys.argv[3] if len(sys.argv) > 3 else "*"
assert "site-packages" in myops_ort.__file__, myops_ort.__file__
assert {"swish", "rms_norm"} <= set(myops_ort.opspec.OPS), sorted(myops_ort.opspec.OPS)
manifest = json.loads((artifacts / "manifest.json").read_text())
checked = []
for model in manifest["models"]:
    if not fnmatch.fnmatch(model["file"], pattern):
        continue
    options = myops_ort.register(ort.SessionOptions())
    session = ort.InferenceSession(str(artifacts / model["file"]), options, providers=["CPUExecutionProvider"])
    with np.load(artifacts / model["inputs"]) as inputs:
        feed = {i.name: inputs[i.name] for i in session.get_inputs()}
    with np.load(artifacts / model["reference"]) as reference:
        expected = reference[reference.files[0]]
    got = session.run(None, feed)[0]
    error = float(np.max(np.abs(got - expected)))
    assert error <= atol, f"{model['file']}: max abs error {error} > {atol}"
    checked.append(f"{model['file']}:{error:.1e}")

# a real session on a registered plugin, then an onnxruntime that reports an older release
ort.__version__ = "1.16.3"
try:
    myops_ort.register(ort.SessionOptions())
except myops_ort.OnnxRuntimeMismatch as exc:
    refused = str(exc)
else:
    raise AssertionError("an onnxruntime older than the library's headers was not refused")
print(json.dumps({"checked": checked, "refused": refused, "library": myops_ort.get_library_path()}))
