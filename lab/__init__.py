"""Orchestration glue of the lab: the matrix, provenance, atomic result files."""
