"""Run in a clean venv holding only the entry's torch, onnx, onnxscript and the myops-torch wheel
(python -I: nothing of the checkout on the path): the ops against their references, gradients,
opcheck, then a model exported to ONNX with the custom nodes.   python -I torch_layer1.py OUT_DIR"""
import json
import sys
from importlib import metadata
from pathlib import Path

import torch

import myops_torch

out = Path(sys.argv[1])
assert "site-packages" in myops_torch.__file__, myops_torch.__file__
torch.manual_seed(0)
x = torch.randn(4, 16, 64)
weight = torch.rand(64) + 0.5
swish = torch.ops.myops.swish(x)
torch.testing.assert_close(swish, x * torch.sigmoid(x))
torch.testing.assert_close(myops_torch.rms_norm(x, weight, 1e-6),
                           x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight)
xd = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
assert torch.autograd.gradcheck(torch.ops.myops.swish, (xd,))
torch.library.opcheck(torch.ops.myops.swish.default, (x,))


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(64, 64)
        self.weight = torch.nn.Parameter(weight.clone())

    def forward(self, h):
        return myops_torch.rms_norm(myops_torch.swish(self.proj(h)), self.weight, 1e-6)


result = myops_torch.export_model(Block().eval(), (x,), out / "block.onnx")
import onnx  # noqa: E402

nodes = [n.op_type for n in onnx.load(str(out / "block.onnx")).graph.node if n.domain == "myops"]
assert nodes == ["Swish", "RMSNorm"], nodes
requires = [r for r in metadata.requires("myops-torch") or [] if r.startswith("torch")]
print(json.dumps({"version": myops_torch.__version__, "requires": requires, "custom_nodes": nodes,
                  "library": myops_torch.load()}))
