"""Measurement (bench.run, bench.measure, bench.targets) and reporting (bench.report) of the four rows."""
