"""The GPU host's parts of `python -m bench.gpu_check`, one job per module: host (preflight), build
(the extension and the plugin harness), kernels (launch constants read off kernels/), plugin (the
plugin's CUDA kernel against its float64 reference), suite (the cuda tests under pytest), rows and
targets (the benchmark). Nothing here imports onnx or onnxruntime at module level: a host with torch,
numpy and pytest is enough."""
