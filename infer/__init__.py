"""The inference side's Python, torch-free: what the infer image runs on a host.

runner (`python -m infer.runner {verify,dump,bench}`), the ONNX Runtime rows of the benchmark
(measure, one row per process), the results' row format (rows) and the workloads. It uses the plugin
package (ort_plugin), the op catalogue (opspec) and the base package (lab); never torch, ops or bench.
The infer image installs these packages whole.
"""
