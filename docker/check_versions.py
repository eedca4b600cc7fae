"""Fail an image build whose Python or packages differ from the matrix entry's pins.

    python check_versions.py python=3.11 torch=2.13.0 onnxruntime=1.32.0 ...

The pins arrive as build args filled from matrix.yaml (lab/docker.py); an empty value means the
image does not carry that package. Local version suffixes ('+cpu', '+cu121') are ignored.
"""
import importlib.metadata
import sys


def installed(name: str):
    if name == "python":
        return "%d.%d" % sys.version_info[:2]
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def main(pairs) -> int:
    problems, checked = [], []
    for pair in pairs:
        name, _, wanted = pair.partition("=")
        if not wanted:
            continue
        have = installed(name)
        if have is None or have.split("+")[0] != wanted:
            problems.append(f"{name} {have or 'missing'} (matrix.yaml pins {wanted})")
        else:
            checked.append(f"{name} {have}")
    if problems:
        print("error: the image differs from its matrix entry: " + "; ".join(problems)
              + ". Rebuild the entry's lock (delete docker/locks/<entry>-*.txt) or fix matrix.yaml.", file=sys.stderr)
        return 1
    print("versions match the matrix entry: " + ", ".join(checked))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
