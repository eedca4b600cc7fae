"""Alignment layer 3: the same ONNX files and inputs run on several machines or builds must agree.

    python -m bench.cross_machine_diff [TARGET ...]      (nox -s cross_machine_diff -- TARGET ...)

TARGET is `local` (this virtualenv), `docker` (the default daemon), `context:NAME` (a docker
context), or a daemon address (unix://..., tcp://..., ssh://user@host); `@ENTRY` picks the matrix
entry whose infer image runs there (default cpu), e.g. `ssh://gpu-box@cuda12.1`, and `@ENTRY/ARCH` its
image for that architecture (`docker@cpu/arm64`: under emulation on an x86-64 daemon with
qemu-user-static). Default: `docker local`.

Every target gets the same artifacts (ONNX files and inputs, each checked against its sha256
before anything runs) and runs the torch-free `dump`; the first target is the reference. Per
model and output: max abs/rel difference, mean, median, count above tolerance and the worst
element. Writes results/cross_machine_diff.{csv,md}; exit 1 when any output is out of tolerance
or any target failed, with one line per failure.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import fnmatch
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "results"
TOLERANCES = Path(__file__).resolve().parent / "tolerances.yaml"
COLUMNS = ["reference", "target", "model", "output", "shape", "max_abs", "max_rel", "mean_abs", "median_abs",
           "tolerance", "above_tolerance", "worst_index", "reference_value", "target_value", "ok",
           "reference_host", "target_host", "reference_ort", "target_ort", "target_providers", "model_sha256",
           "reference_plugin_sha256", "target_plugin_sha256"]


@dataclass(frozen=True)
class Target:
    spec: str
    kind: str          # local | docker
    host: str | None   # daemon address or context:NAME; None = default daemon
    entry: str
    arch: str | None = None  # the infer image's architecture (amd64, arm64); None: the plain tag's

    @property
    def label(self) -> str:
        return self.spec


def parse_target(spec: str) -> Target:
    from lab import matrix

    from lab import platforms

    # ssh://user@host has an '@' of its own: only a known entry id (and /ARCH) after the last '@' is one.
    where, sep, suffix = spec.rpartition("@")
    entry, _, arch = suffix.partition("/")
    if not sep or entry not in matrix.load()["entries"]:
        where, entry, arch = spec, matrix.DEFAULT_ENTRY, ""
    if arch:
        try:
            declared = [p.docker for p in platforms.infer_platforms(matrix.entry(entry))]
            arch = platforms.get(arch).docker
        except platforms.PlatformError as exc:
            raise ValueError(f"target {spec!r}: {exc}") from None
        if arch not in declared:
            raise ValueError(f"target {spec!r}: entry '{entry}' has no {arch} infer image (matrix.yaml: "
                             f"infer_platforms {', '.join(declared)})")
    if where == "local":
        if arch:
            raise ValueError(f"target {spec!r}: `local` is this machine; an architecture goes with a Docker target")
        return Target(spec, "local", None, entry)
    if where == "docker":
        return Target(spec, "docker", None, entry, arch or None)
    if where.startswith("context:") or where.split("://")[0] in ("unix", "tcp", "ssh", "npipe"):
        return Target(spec, "docker", where, entry, arch or None)
    raise ValueError(f"target {spec!r} is none of: local, docker, context:NAME, unix://..., tcp://..., ssh://...")


class TargetFailed(RuntimeError):
    pass


def _run_local(target: Target, artifacts: Path, out: Path, timeout: float, plugin: str | None) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if plugin:
        env["MYOPS_ORT_PLUGIN"] = plugin
    try:
        result = subprocess.run([sys.executable, "-m", "infer.runner", "dump", "--artifacts", str(artifacts),
                                 "--out", str(out)], capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        raise TargetFailed(f"no answer within {timeout:.0f} s") from exc
    if result.returncode != 0:
        raise TargetFailed(result.stderr.strip().splitlines()[-1] if result.stderr.strip() else f"exit {result.returncode}")


def _run_docker(target: Target, artifacts: Path, out: Path, timeout: float) -> None:
    from lab import docker

    deadline = time.monotonic() + timeout

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TargetFailed(f"no answer within {timeout:.0f} s")
        return remaining

    if docker.daemon_version(target.host, timeout=min(20, left())) is None:
        raise TargetFailed(f"no Docker daemon answers at {target.host or 'the default address'}")
    image = infer_image(target)
    if image is None:
        wanted = f" for {target.arch}" if target.arch else ""
        raise TargetFailed(f"no {target.entry} infer image{wanted} on that daemon: `nox -s build -- {target.entry}"
                           f"{' --arch ' + target.arch if target.arch else ''}` there, or pull it from where "
                           f"`nox -s publish` pushed it, or `nox -s publish -- {target.entry} --archive DIR` and docker load it")
    created = docker._docker("create", "--network", "none", image, "dump", "--artifacts", "/tmp/artifacts",
                             "--out", "/tmp/out", host=target.host, timeout=left())
    container = created.stdout.decode().strip()
    try:
        docker._docker("cp", str(artifacts), f"{container}:/tmp/artifacts", host=target.host, timeout=left())
        started = docker._docker("start", "-a", container, host=target.host, timeout=left(), check=False)
        if started.returncode != 0:
            err = (started.stderr or b"").decode(errors="replace").strip().splitlines()
            raise TargetFailed(err[-1] if err else f"dump exited {started.returncode}")
        docker._docker("cp", f"{container}:/tmp/out/.", str(out), host=target.host, timeout=left())
    except docker.DockerError as exc:
        raise TargetFailed(str(exc)) from exc
    finally:
        docker._docker("rm", "-f", container, host=target.host, timeout=60, check=False)


def infer_image(target: Target) -> str | None:
    """The target's infer image on its daemon: the plain tag (a pulled multi-arch image is there in
    the daemon's own architecture), else, for an architecture, the tag that carries it."""
    from lab import docker, matrix, platforms

    entry = matrix.entry(target.entry)
    plain = docker.image_tags(entry)["infer"]
    if target.arch is None:
        return plain if docker.image_id(plain, host=target.host) else None
    for tag in (plain, docker.image_tags(entry, platforms.get(target.arch))["infer"]):
        if docker.image_architecture(tag, host=target.host) == target.arch:
            return tag
    return None


def run_target(target: Target, artifacts: Path, out: Path, *, timeout: float = 600, plugin: str | None = None) -> dict:
    """Run `dump` on one target; returns its provenance. Raises TargetFailed with a one-line reason."""
    out.mkdir(parents=True, exist_ok=True)
    try:
        if target.kind == "local":
            _run_local(target, artifacts, out, timeout, plugin)
        else:
            _run_docker(target, artifacts, out, timeout)
    except Exception as exc:  # any failure fails this target only, with its reason
        if isinstance(exc, TargetFailed):
            raise
        raise TargetFailed(f"{type(exc).__name__}: {exc}") from exc
    return json.loads((out / "provenance.json").read_text())


def load_tolerances(path: Path = TOLERANCES):
    import yaml

    data = yaml.safe_load(path.read_text())
    default = float(data["default"]["abs"])
    rules = [(rule["match"], float(rule["abs"])) for rule in data.get("rules", [])]

    def tolerance(key: str) -> float:
        return next((value for pattern, value in rules if fnmatch.fnmatch(key, pattern)), default)

    return tolerance


def compare(reference: Path, other: Path, tolerance) -> list[dict]:
    import numpy as np  # here, so that target parsing imports without numpy (the noxfile uses it)

    rows = []
    with np.load(reference / "outputs.npz") as ref, np.load(other / "outputs.npz") as oth:
        for key in ref.files:
            model, _, output = key.partition("::")
            a = ref[key].astype(np.float64)
            if key not in oth.files:
                rows.append(dict(model=model, output=output, ok=False, above_tolerance="missing", shape=str(a.shape)))
                continue
            b = oth[key].astype(np.float64)
            tol = tolerance(key)
            if a.shape != b.shape:
                rows.append(dict(model=model, output=output, ok=False, tolerance=tol, above_tolerance="shape",
                                 shape=f"{a.shape} vs {b.shape}"))
                continue
            diff = np.abs(a - b)
            both_nan = np.isnan(a) & np.isnan(b)
            diff[both_nan] = 0.0
            diff[np.isnan(diff)] = np.inf  # NaN on one side only
            worst = np.unravel_index(int(np.argmax(diff)), diff.shape) if diff.size else ()
            rel = diff / np.maximum(np.abs(a), np.finfo(np.float32).tiny)
            above = int(np.count_nonzero(diff > tol))
            rows.append(dict(
                model=model, output=output, shape="x".join(map(str, a.shape)),
                max_abs=float(diff.max()) if diff.size else 0.0, max_rel=float(rel.max()) if rel.size else 0.0,
                mean_abs=float(diff.mean()) if diff.size else 0.0, median_abs=float(np.median(diff)) if diff.size else 0.0,
                tolerance=tol, above_tolerance=above, worst_index=list(map(int, worst)),
                reference_value=float(a[worst]) if diff.size else None, target_value=float(b[worst]) if diff.size else None,
                ok=above == 0,
            ))
    return rows


def summary_markdown(rows: list[dict], failures: list[str], targets: list[Target], provenance: dict) -> str:
    lines = ["# Cross-machine diff (alignment layer 3)", "",
             f"Reference: `{targets[0].label}`; compared: {', '.join(f'`{t.label}`' for t in targets[1:])}.", ""]
    for target in targets:
        facts = provenance.get(target.label)
        if facts:
            lines.append(f"- `{target.label}`: host {facts.get('host')}, {facts.get('cpu')}, onnxruntime "
                         f"{facts.get('onnxruntime')}, providers {facts.get('execution_providers')}")
    lines += ["", "| target | model | output | max abs | max rel | above tol | worst element (ref vs target) | ok |",
              "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "max_abs" in r:
            lines.append(f"| {r['target']} | {r['model']} | {r['output']} | {r['max_abs']:.3e} | {r['max_rel']:.3e} | "
                         f"{r['above_tolerance']} | {r['worst_index']}: {r['reference_value']:.9g} vs {r['target_value']:.9g} "
                         f"| {'yes' if r['ok'] else 'NO'} |")
        else:
            lines.append(f"| {r['target']} | {r['model']} | {r['output']} | - | - | {r['above_tolerance']} | - | NO |")
    if failures:
        lines += ["", "## Failures", ""] + [f"- {f}" for f in failures]
    return "\n".join(lines) + "\n"


def run(target_specs: list[str], *, artifacts: Path, results: Path = RESULTS, timeout: float = 600,
        plugins: dict | None = None, log=print) -> int:
    from lab.files import write_csv_atomic, write_text_atomic
    from infer.runner import ArtifactError, load_manifest

    targets = [parse_target(spec) for spec in target_specs]
    if len(targets) < 2:
        raise ValueError("give at least two targets to compare")
    try:
        manifest = load_manifest(artifacts)  # refuse damaged local artifacts before shipping them anywhere
    except ArtifactError as exc:
        log(f"FAIL artifacts: {exc}")
        return 1
    failures, provenance = [], {}
    with tempfile.TemporaryDirectory(prefix="xdiff-") as tmp:
        outs = {t.label: Path(tmp) / f"t{i}" for i, t in enumerate(targets)}
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(targets)) as pool:
            futures = {pool.submit(run_target, t, artifacts, outs[t.label], timeout=timeout,
                                   plugin=(plugins or {}).get(t.label)): t for t in targets}
            for future in concurrent.futures.as_completed(futures):
                target = futures[future]
                try:
                    provenance[target.label] = future.result()
                    log(f"[xdiff] {target.label}: dumped ({provenance[target.label].get('host')}, "
                        f"onnxruntime {provenance[target.label].get('onnxruntime')})")
                except TargetFailed as exc:
                    failures.append(f"target {target.label}: {exc}")
                    log(f"FAIL target {target.label}: {exc}")
        reference = targets[0]
        rows = []
        tolerance = load_tolerances()
        if reference.label in provenance:
            for target in targets[1:]:
                if target.label not in provenance:
                    continue
                for row in compare(outs[reference.label], outs[target.label], tolerance):
                    row.update(reference=reference.label, target=target.label,
                               reference_host=provenance[reference.label].get("host"),
                               target_host=provenance[target.label].get("host"),
                               reference_ort=provenance[reference.label].get("onnxruntime"),
                               target_ort=provenance[target.label].get("onnxruntime"),
                               target_providers=",".join(provenance[target.label].get("execution_providers", [])),
                               model_sha256=manifest["files"].get(row["model"]),
                               reference_plugin_sha256=provenance[reference.label].get("plugin_sha256"),
                               target_plugin_sha256=provenance[target.label].get("plugin_sha256"))
                    rows.append(row)
                    if not row["ok"]:
                        where = (f"worst element {row['worst_index']}: {row['reference_value']!r} vs {row['target_value']!r}, "
                                 f"max abs {row['max_abs']:.3e} > {row['tolerance']:.1e}") if "max_abs" in row else row["above_tolerance"]
                        failures.append(f"target {target.label}, model {row['model']}, output {row['output']}: {where}")
                        log(f"FAIL target {target.label}, model {row['model']}, output {row['output']}: {where}")
    write_csv_atomic(results / "cross_machine_diff.csv", rows, COLUMNS)
    write_text_atomic(results / "cross_machine_diff.md", summary_markdown(rows, failures, targets, provenance))
    ok = sum(1 for r in rows if r["ok"])
    log(f"[xdiff] {ok}/{len(rows)} outputs within tolerance, {len(failures)} failure(s); "
        f"wrote {results / 'cross_machine_diff.csv'} and .md")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cross_machine_diff", description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", default=["docker", "local"])
    parser.add_argument("--artifacts", type=Path, default=REPO / "build" / "artifacts")
    parser.add_argument("--timeout", type=float, default=600, help="seconds a target may take before it fails")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    try:
        return run(args.targets, artifacts=args.artifacts, results=args.results, timeout=args.timeout)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
