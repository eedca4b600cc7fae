"""Measurement (bench.run, bench.torch_rows and infer.measure, bench.targets) and reporting (bench.report) of the four rows."""
