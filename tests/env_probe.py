"""A stand-in timing process for tests: prints, as infer.measure does its result, the environment it got."""
import json
import os

if __name__ == "__main__":
    print(json.dumps({name: os.environ.get(name) for name in ("GLIBC_TUNABLES", "MYOPS_CPU_ISA", "PYTHONPATH")}))
