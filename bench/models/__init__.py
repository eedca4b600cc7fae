"""Whole models through the chain: `nox -s model -- MODEL` (bench.models.run), their catalogue and rows."""
