"""The inference-side runner (no torch): `python -m infer.runner {verify,dump,bench}`.

    verify  load the plugin, run every model of an artifacts dir on its stored inputs, compare
            with the stored PyTorch outputs (rtol 1e-4, atol 1e-5); exit 1 on any mismatch
    dump    run every model and write the outputs (npz) plus provenance (json), for layer 3
    bench   the ONNX Runtime rows of the benchmark on this host (fresh process per row), on the CUDA EP
            when there is one (--providers to choose); --out DIR writes them in the results/ CSV format;
            --model FILE ... measures whole ONNX files instead (infer.model_files)
    doctor  onnxruntime, the plugin, the GPU and given ONNX files at a glance (ort_plugin/doctor.py)

Artifacts come from `python -m ops.artifacts`; every file is checked against manifest.json's
sha256 before anything runs, so a file damaged in transport is refused, not measured.
"""
from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import platform
import sys
from pathlib import Path

import numpy as np

from ort_plugin.diagnose import FeedError, check_feed
from ort_plugin.loader import PluginError, check_library, default_library, make_session
from ort_plugin.onnx_file import ModelFileError

from .workloads import GPU_ONLY_WORKLOADS, WORKLOADS

RTOL, ATOL = 1e-4, 1e-5
APP_ROOT = Path(__file__).resolve().parent.parent  # where infer.measure imports from
DEFAULT_ARTIFACTS = Path(os.environ.get("MYOPS_ARTIFACTS", Path(__file__).resolve().parent.parent / "build" / "artifacts"))


class ArtifactError(RuntimeError):
    pass


def load_manifest(artifacts: Path) -> dict:
    path = Path(artifacts) / "manifest.json"
    if not path.is_file():
        raise ArtifactError(f"{path} not found: create artifacts with `python -m ops.artifacts --out {artifacts}`")
    manifest = json.loads(path.read_text())
    for name, expected in manifest["files"].items():
        file = Path(artifacts) / name
        if not file.is_file():
            raise ArtifactError(f"{file} listed in manifest.json is missing")
        actual = hashlib.sha256(file.read_bytes()).hexdigest()
        if actual != expected:
            raise ArtifactError(f"{file}: sha256 {actual[:16]}... does not match the manifest's {expected[:16]}...: "
                                "the file was changed or damaged in transport; copy it again")
    return manifest


def providers(requested: str | None) -> list[str]:
    import onnxruntime as ort

    available = ort.get_available_providers()
    if requested:
        wanted = requested.split(",")
        missing = [p for p in wanted if p not in available]
        if missing:
            hint = (": for CUDAExecutionProvider run the CUDA entry's infer image with `docker run --gpus all`, or "
                    "install onnxruntime-gpu for the host's CUDA major" if "CUDAExecutionProvider" in missing else "")
            raise PluginError(f"execution provider(s) {missing} not available in this onnxruntime ({available}){hint}")
        return wanted
    return [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]


def host_facts(execution_providers: list[str]) -> dict:
    import onnxruntime as ort

    from lab.provenance import collect

    return {**collect(with_torch=False), "execution_providers": execution_providers,
            "available_providers": ort.get_available_providers(), "machine": platform.machine()}


def run_models(artifacts: Path, *, library, execution_providers, selected=None):
    """Yield (model entry, outputs dict) for every model of the manifest."""
    manifest = load_manifest(artifacts)
    for item in manifest["models"]:
        if selected and item["file"] not in selected:
            continue
        session = make_session(Path(artifacts) / item["file"], library=library, providers=execution_providers)
        with np.load(Path(artifacts) / item["inputs"]) as stored:
            feed = dict(stored)
        check_feed(session, feed)
        outputs = session.run(None, feed)
        names = [o.name for o in session.get_outputs()]
        yield item, dict(zip(names, outputs))


def verify(args) -> int:
    contents = os.environ.get("MYOPS_CONTENTS")  # set in the infer image: its recorded content manifest
    if contents:
        from ort_plugin.contents import ContentsError, check

        try:
            value, files = check(Path(contents).parent)
        except ContentsError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"verify: contents sha256 {value} ({files} files under {Path(contents).parent}, as recorded at build)")
    eps = providers(args.providers)
    library = args.plugin or default_library()
    selected = None
    if args.only:
        listed = [item["file"] for item in load_manifest(args.artifacts)["models"]]
        selected = {name for name in listed if any(fnmatch.fnmatchcase(name, pattern) for pattern in args.only)}
        if not selected:
            print(f"error: no model of {args.artifacts} matches --only {' '.join(args.only)}; its models: "
                  f"{', '.join(listed)}", file=sys.stderr)
            return 2
        print(f"verify: {len(selected)} of the {len(listed)} models (--only {' '.join(args.only)})")
    failures = 0
    print(f"verify: plugin {library}, providers {eps}")
    for item, outputs in run_models(args.artifacts, library=library, execution_providers=eps, selected=selected):
        with np.load(Path(args.artifacts) / item["reference"]) as reference:
            for name, expected in reference.items():
                actual = outputs[name]
                error = float(np.max(np.abs(actual.astype(np.float64) - expected))) if actual.size else 0.0
                ok = actual.shape == expected.shape and np.allclose(actual, expected, rtol=RTOL, atol=ATOL)
                failures += not ok
                print(f"  {'ok  ' if ok else 'FAIL'} {item['file']:45} {name}: max abs diff {error:.3e}")
    print(f"verify: {'all models match' if not failures else f'{failures} output(s) out of tolerance'} "
          f"(rtol {RTOL}, atol {ATOL})")
    return 1 if failures else 0


def dump(args) -> int:
    eps = providers(args.providers)
    library = args.plugin or default_library()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for item, outputs in run_models(args.artifacts, library=library, execution_providers=eps):
        for name, value in outputs.items():
            arrays[f"{item['file']}::{name}"] = value
    tmp = out / ".outputs.npz.tmp"
    with open(tmp, "wb") as handle:
        np.savez(handle, **arrays)
    os.replace(tmp, out / "outputs.npz")
    facts = host_facts(eps)
    plugin_path = check_library(library)
    facts.update(plugin=str(plugin_path), plugin_sha256=hashlib.sha256(plugin_path.read_bytes()).hexdigest())
    (out / "provenance.json").write_text(json.dumps(facts, indent=2) + "\n")
    print(f"dump: {len(arrays)} outputs to {out / 'outputs.npz'} ({facts['host']}, onnxruntime {facts['onnxruntime']})")
    return 0


# The workloads whose models the artifacts hold (exported at hidden 768: an op's weights are that
# long); the GPU-only ones (swish_large) only on a GPU.
ARTIFACT_HIDDEN = 768
DEFAULT_WORKLOADS = tuple(name for name, w in WORKLOADS.items() if w.hidden == ARTIFACT_HIDDEN)


MODEL_COLUMNS = ["entry", "file", "sha256", "inputs", "threads", "warmup", "runs", "processes", "p20_ms", "p50_ms",
                 "p80_ms", "process_spread", "peak_mb", "execution_provider", "onnxruntime", "cpu", "host", "timestamp"]


def bench_models(args) -> int:
    """`bench --model FILE ...`: whole ONNX files (a model's exports, `nox -s fuse`'s output) as the lab
    measures its ORT rows: interleaved rounds, a fresh process per file and round (infer.model_files)."""
    import statistics
    import subprocess
    import time

    from .rows import file_sha256

    batch, _, seq = args.shape.partition("x")
    dims = [int(batch), int(seq or batch)]
    library = str(args.plugin or default_library())
    check_library(library)
    files = [Path(f) for f in args.model]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise ArtifactError(f"no such ONNX file: {', '.join(missing)}")
    facts = host_facts(["CPUExecutionProvider"])
    print(f"bench: {len(files)} model files x {args.rounds} rounds on CPUExecutionProvider ({facts['cpu']}), inputs with "
          f"symbolic dimensions {args.shape}, {args.threads} threads")
    measured = {f: [] for f in files}
    for k in range(args.rounds):
        for i in range(len(files)):
            path = files[(i + k) % len(files)]  # each round from another file, so drift hits every file alike
            spec = dict(path=str(path), plugin=library, dims=dims, threads=args.threads, warmup=args.warmup,
                        runs=args.runs, int_high=args.int_high)
            started = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "infer.model_files", json.dumps(spec)], capture_output=True,
                                  text=True, cwd=APP_ROOT)
            if done.returncode != 0:
                tail = "\n".join(done.stderr.strip().splitlines()[-8:])
                print(f"error: {path} failed in round {k + 1}; nothing was written:\n{tail}", file=sys.stderr)
                return 1
            result = json.loads(done.stdout.strip().splitlines()[-1])
            measured[path].append(result)
            print(f"[bench round {k + 1}/{args.rounds}] {path.name:30} p50 {result['p50_ms']:9.3f} ms "
                  f"({time.perf_counter() - started:.0f} s)", flush=True)
    rows = []
    for path, results in measured.items():
        seconds = sorted(s for r in results for s in r["seconds"])
        medians = [statistics.median(r["seconds"]) for r in results]
        pick = lambda q: round(seconds[min(len(seconds) - 1, int(q * len(seconds)))] * 1e3, 4)  # noqa: E731
        p50 = statistics.median(seconds)
        rows.append(dict(entry=os.environ.get("MYOPS_MATRIX_ENTRY", "cpu"), file=path.name, sha256=file_sha256(path),
                         inputs=json.dumps(results[0]["inputs"]), threads=args.threads, warmup=args.warmup,
                         runs=args.runs, processes=len(results), p20_ms=pick(0.2), p50_ms=round(p50 * 1e3, 4),
                         p80_ms=pick(0.8), process_spread=round((max(medians) - min(medians)) / p50, 4),
                         peak_mb=results[0]["peak_mb"], execution_provider="CPUExecutionProvider",
                         onnxruntime=facts["onnxruntime"], cpu=facts["cpu"], host=facts.get("host"),
                         timestamp=facts.get("timestamp")))
        print(f"  {path.name:30} p50 {rows[-1]['p50_ms']:9.3f} ms  spread over processes {rows[-1]['process_spread']:.1%}  "
              f"peak {rows[-1]['peak_mb']} MB")
    if args.out:
        from lab.files import write_csv_atomic

        out = Path(args.out) / rows[0]["entry"] / "model_files.csv"
        out.parent.mkdir(parents=True, exist_ok=True)
        write_csv_atomic(out, rows, MODEL_COLUMNS)
        print(f"bench: wrote {out}")
    return 0


def bench(args) -> int:
    """The ONNX Runtime rows on this host, each in a fresh process; rows in the benchmark's CSV format."""
    if args.model:
        return bench_models(args)
    import subprocess
    import tempfile
    import time

    from .rows import copy_models, derive, ort_row_specs, record, samples_of, write, write_copy_model
    manifest = load_manifest(args.artifacts)
    library = str(args.plugin or default_library())
    provider = providers(args.providers)[0]
    on_gpu = provider == "CUDAExecutionProvider"
    # On a GPU the small activation fits in L2: the large one is the one whose floor is DRAM bandwidth.
    workloads = args.workload or [w for w in DEFAULT_WORKLOADS if on_gpu or w not in GPU_ONLY_WORKLOADS]
    if not on_gpu and set(workloads) & set(GPU_ONLY_WORKLOADS):
        raise ArtifactError(f"--workload {' '.join(sorted(set(workloads) & set(GPU_ONLY_WORKLOADS)))} is for "
                            "CUDAExecutionProvider only (hundreds of MB per run)")
    model_of = {w: WORKLOADS[w].model_name for w in workloads}
    models = [m for m in manifest["models"] if m["model"] in model_of.values()]
    exporter = args.exporter or sorted({m["exporter"] for m in models})[0]
    opset = args.opset or max(m["opset"] for m in models if m["exporter"] == exporter)
    entry = os.environ.get("MYOPS_MATRIX_ENTRY", "cpu")
    facts = host_facts([provider])
    print(f"bench: onnxruntime {facts['onnxruntime']} on {provider} ({facts['gpu'] or facts['cpu']}), plugin {library}, "
          f"{exporter} opset {opset}, {args.threads} threads")
    specs = []
    with tempfile.TemporaryDirectory(prefix="bench-copy-") as tmp:
        for workload in workloads:
            paths = {}
            for lowering in ("decomposed", "custom"):
                item = next((m for m in models if (m["model"], m["lowering"], m["exporter"], m["opset"])
                             == (model_of[workload], lowering, exporter, opset)), None)
                if item is None:
                    raise ArtifactError(f"no {workload} {lowering} model for {exporter} opset {opset} in {args.artifacts}; "
                                        f"it has opsets {sorted({m['opset'] for m in models})}")
                paths[lowering], beta = str(Path(args.artifacts) / item["file"]), item.get("beta", 1.0)
            hidden = WORKLOADS[workload].hidden
            if WORKLOADS[workload].op_alone:  # on a GPU, Identity alone until the plugin's CUDA Copy has run on one
                paths.update({"copy": write_copy_model(Path(tmp) / f"copy-h{hidden}-opset{opset}.onnx", opset,
                                                       hidden=hidden)} if on_gpu else copy_models(Path(tmp), opset, hidden))
            runs = dict(warmup=args.warmup, runs=args.runs) if WORKLOADS[workload].op_alone else \
                dict(warmup=args.ffn_warmup, runs=args.ffn_runs)
            common = dict(workload=workload, beta=beta, threads=args.threads, opset=opset, exporter=exporter,
                          execution_provider=provider, **runs)
            specs += ort_row_specs(common, paths, library)
        rows, samples = [], []
        for number, spec in enumerate(specs, 1):
            label = f"{spec['workload']:5} {spec['row']:13} {spec['ort_opt_level']:5}"
            print(f"[bench {number}/{len(specs)}] {label} ...", end=" ", flush=True)
            started = time.perf_counter()
            result = subprocess.run([sys.executable, "-m", "infer.measure", json.dumps(spec)], capture_output=True,
                                    text=True, cwd=APP_ROOT)
            if result.returncode != 0:
                print("failed", flush=True)
                tail = "\n".join(result.stderr.strip().splitlines()[-12:])
                print(f"error: row {spec['row']} ({spec['workload']}, {spec['ort_opt_level']}) failed; nothing was "
                      f"written:\n{tail}", file=sys.stderr)
                return 1
            measured = json.loads(result.stdout.strip().splitlines()[-1])
            peak = "n/a" if measured["peak_mb"] is None else f"{measured['peak_mb']:.1f} MB"
            device = "" if measured.get("device_ms") is None else f", device {measured['device_ms']:.4f} ms"
            print(f"p50 {measured['p50_ms']:.3f} ms{device}, peak {peak}, graph {measured['graph']} "
                  f"({time.perf_counter() - started:.0f} s)", flush=True)
            rows.append(record(entry, spec, measured, facts))
            samples += samples_of(rows[-1], [measured])
    from lab.provenance import cpu_caches

    derive(rows, None if on_gpu else cpu_caches())  # no GPU's L2 size without torch: its regime stays unknown
    for r in rows:
        copy = "-" if r["fraction_of_copy"] is None else f"{r['fraction_of_copy']:.2f}"
        print(f"  {r['workload']:11} {r['row']:13} {r['ort_opt_level']:5} p50 {r['p50_ms']:8.3f} ms  "
              f"{r['gb_per_s']:7.1f} GB/s  of copy floor {copy}")
    if args.out:
        print(f"bench: wrote {len(rows)} rows to {write(args.out, entry, rows, samples)} (raw timings in samples.csv) "
              f"and {Path(args.out) / 'bench_all.csv'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="runner", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("verify", "dump", "bench"):
        p = sub.add_parser(name)
        p.add_argument("--artifacts", type=Path, default=DEFAULT_ARTIFACTS)
        p.add_argument("--plugin", type=Path, help="plugin library (default: $MYOPS_ORT_PLUGIN or the built one)")
        p.add_argument("--providers", help="comma-separated execution providers (default: CUDA if present, CPU)")
        if name == "verify":
            p.add_argument("--only", action="append", metavar="GLOB", help="only the models whose file name matches "
                           "(repeatable), e.g. '*-custom-*': the ones that run the plugin")
        if name == "dump":
            p.add_argument("--out", type=Path, required=True, help="directory for outputs.npz and provenance.json")
        if name == "bench":
            p.add_argument("--workload", nargs="+", choices=[*DEFAULT_WORKLOADS],
                           help="default: every op's workloads at the artifacts' hidden size (the GPU-only ones on "
                                "CUDAExecutionProvider only)")
            p.add_argument("--threads", type=int, default=os.cpu_count(), help="ORT intra-op threads")
            p.add_argument("--warmup", type=int, default=10)
            p.add_argument("--runs", type=int, default=100)
            p.add_argument("--ffn-warmup", type=int, default=2)
            p.add_argument("--ffn-runs", type=int, default=10, help="the FFN is ~0.4 s a run on 2 CPU cores")
            p.add_argument("--exporter", help="which exported models (default: the first in the manifest)")
            p.add_argument("--opset", type=int, help="default: the newest in the artifacts")
            p.add_argument("--out", type=Path, help="write rows to OUT/<entry>/bench.csv and OUT/bench_all.csv "
                                                    "(the results/ layout; entry from $MYOPS_MATRIX_ENTRY); with "
                                                    "--model, OUT/<entry>/model_files.csv")
            p.add_argument("--model", nargs="+", metavar="FILE",
                           help="measure these whole ONNX files instead (a model's exports, nox -s fuse's output) on "
                                "random inputs, the plugin registered")
            p.add_argument("--shape", default="1x128", help="with --model: the symbolic dimensions in order of first "
                                                            "use, BATCHxSEQ (default 1x128)")
            p.add_argument("--rounds", type=int, default=3, help="with --model: fresh processes per file, interleaved")
            p.add_argument("--int-high", type=int, default=32, help="with --model: integer inputs (token ids) are "
                                                                    "drawn from [0, N)")
    from ort_plugin import doctor

    doctor.add_arguments(sub.add_parser("doctor", help=doctor.__doc__.splitlines()[0]))
    args = parser.parse_args(argv)
    if args.command == "doctor":
        return doctor.report(doctor.ort_sections(args.plugin, args.models), as_json=args.json)
    try:
        return {"verify": verify, "dump": dump, "bench": bench}[args.command](args)
    except (ArtifactError, PluginError, ModelFileError, FeedError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
