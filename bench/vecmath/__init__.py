"""The measurement behind the choice of vector-math library (docs/your-op.md): `python -m bench.vecmath`."""
