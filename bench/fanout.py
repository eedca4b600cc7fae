"""Fan-out: the infer image's `bench --out` on several Docker hosts at once, merged into one results set.

    nox -s bench -- --on TARGET [--on TARGET ...] [--registry R] [--timeout S] [--runs N ...]

TARGET is spelled as for bench.cross_machine_diff: `docker`, `context:NAME`, `unix://...`,
`tcp://...`, `ssh://user@host`, each with `@ENTRY` or `@ENTRY/ARCH` (default: the cpu entry in the
daemon's own architecture). Every daemon is asked who it is first; then different machines run at
once and the targets of one machine (one host name) one after another, native first, so that no run is
timed under another's load. Each target, within --timeout:

1. the entry's infer image must be on that daemon as the one built here (same image id, which is
   the digest of its config): if it is missing or another build, it is pulled from --registry or,
   without one, copied from this daemon (docker save | docker load), and checked again;
2. `bench --out` runs in a container with no network;
3. its rows land in results/<entry>/<host-id>/ (host-id: the daemon's host name, architecture and a
   short hash of the daemon's id and data root), with the `host` and `arch` columns set.

Then results/bench_all.csv is rewritten with every host's rows and results/across_hosts.png draws
the four rows for every host and architecture, one panel per device. A target that fails or times out
is reported and the others' results still land; nothing is written for a failed target. An image whose
architecture is not its daemon's runs under emulation (qemu-user): its rows prove the image runs,
but their timing, bandwidth and memory columns are left empty: emulated timings are not results.
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import json
import re
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from infer.workloads import WORKLOADS
from opspec import PRIMARY

from .cross_machine_diff import Target, TargetFailed, infer_image, parse_target

# Columns an emulated run leaves empty: under qemu-user they measure the emulator.
EMULATED_EMPTY = ("p20_ms", "p50_ms", "p80_ms", "ci_low_ms", "ci_high_ms", "process_spread", "device_ms", "peak_mb",
                  "gb_per_s", "fraction_of_copy", "custom_node_share")
EMULATED_METHOD = "not timed: emulated (qemu-user)"
MACHINE_OF = {"x86_64": "amd64", "aarch64": "arm64"}
# Under emulation every row runs, but briefly: its figures are discarded anyway.
EMULATED_ARGS = ["--workload", PRIMARY, "--warmup", "1", "--runs", "3"]


@dataclass
class HostRun:
    target: Target
    info: dict = field(default_factory=dict)   # the daemon's `docker info`
    arch: str = ""          # the image's architecture, Docker's name: amd64, arm64
    host_id: str = ""
    emulated: bool = False
    image: str = ""
    rows: list = field(default_factory=list)
    samples: list = field(default_factory=list)
    error: str = ""

    @property
    def machine(self) -> str:
        """Daemons on one machine share its host name: their runs must not overlap."""
        return self.info.get("Name") or self.target.label


def daemon_facts(host: str | None, timeout: float) -> dict:
    from lab import docker

    try:
        result = docker._docker("info", "--format", "{{json .}}", host=host, timeout=timeout, check=False)
    except docker.DockerError as exc:
        raise TargetFailed(str(exc)) from exc
    if result.returncode != 0:
        raise TargetFailed(f"no Docker daemon answers at {host or 'the default address'}")
    return json.loads(result.stdout.decode())


def host_id(info: dict, arch: str) -> str:
    """A folder name per daemon and architecture: readable, and unique for two daemons on one machine
    (which may share the engine's ID, but never a data root)."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", info.get("Name") or "host").strip("-") or "host"
    daemon = f"{info.get('ID')}|{info.get('DockerRootDir')}"
    return f"{name}-{arch}-{hashlib.sha256(daemon.encode()).hexdigest()[:6]}"


def image_arch(target: Target, info: dict) -> str:
    """The architecture asked for; without one, the daemon's own where the entry has an image for it."""
    from lab import matrix, platforms

    if target.arch:
        return target.arch
    native = MACHINE_OF.get(info.get("Architecture"))
    declared = [p.docker for p in platforms.infer_platforms(matrix.entry(target.entry))]
    return native if native in declared else platforms.PRIMARY.docker


def ensure_image(run: HostRun, registry: str | None, left, log) -> str:
    """The target's infer image, made the one built here (by image id) by a pull or a copy; its tag there."""
    from lab import docker, matrix, platforms

    target, arch = run.target, run.arch
    entry = matrix.entry(target.entry)
    local = docker.image_tags(entry, platforms.get(arch))["infer"]
    expected = docker.image_id(local)
    if expected is None:
        raise TargetFailed(f"{local} is not built here, so there is nothing to check the target's image against: "
                           f"`nox -s build -- {target.entry} --arch {arch}` first")
    found = infer_image(replace(target, arch=arch))
    if found and docker.image_id(found, host=target.host) == expected:
        return found
    why = f"has another build of {found}" if found else f"lacks the {target.entry} infer image for {arch}"
    if registry:
        remote = f"{registry.rstrip('/')}/{docker.image_tags(entry)['infer'].split('/', 1)[-1]}"
        log(f"[fanout] {target.label}: {why}; pulling {remote} ({arch}) ...")
        try:
            got = docker.pull(remote, host=target.host, arch=arch, timeout=left())
        except docker.DockerError as exc:
            raise TargetFailed(f"{why}, and the pull failed: {exc}") from exc
        if got != expected:
            raise TargetFailed(f"{remote} ({arch}) in the registry is image {got}, not this checkout's {expected}: "
                               f"`nox -s publish -- {target.entry} --registry {registry}` first")
        docker._docker("tag", remote, local, host=target.host, timeout=left())
        return local
    log(f"[fanout] {target.label}: {why}; copying {local} from this daemon ...")
    save = subprocess.Popen(["docker", "save", local], stdout=subprocess.PIPE, env=docker.daemon_env(None))
    try:
        load = subprocess.run(["docker", "load"], stdin=save.stdout, capture_output=True, timeout=left(),
                              env=docker.daemon_env(target.host))
    except subprocess.TimeoutExpired as exc:
        save.kill()
        raise TargetFailed("the image copy did not finish in time") from exc
    finally:
        save.stdout.close()
        save.wait()
    if load.returncode != 0 or save.returncode != 0:
        raise TargetFailed(f"copying {local} there failed: {load.stderr.decode(errors='replace').strip()[-300:]}")
    if docker.image_id(local, host=target.host) != expected:
        raise TargetFailed(f"{local} there is not image {expected} after the copy")
    return local


# On every container a fan-out starts, so that its own can be told from others on a shared daemon.
FANOUT_LABEL = "lab.fanout=bench"


def run_bench(run: HostRun, bench_args: list[str], out: Path, left, log) -> None:
    """`bench --out` in a container on the target; its output shown line by line as it comes."""
    from lab import docker

    created = docker._docker("create", "--network", "none", "--label", FANOUT_LABEL, run.image, "bench", "--out",
                             "/tmp/out", *bench_args,
                             host=run.target.host, timeout=left())
    container = created.stdout.decode().strip()
    timed_out = threading.Event()
    try:
        with subprocess.Popen(["docker", "start", "-a", container], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, errors="replace", env=docker.daemon_env(run.target.host)) as proc:

            def stop() -> None:  # the bound: the client goes, and the container with it
                timed_out.set()
                proc.kill()
                docker._docker("rm", "-f", container, host=run.target.host, timeout=60, check=False)

            watchdog = threading.Timer(max(left(), 1), stop)
            watchdog.start()
            tail = []
            try:
                for line in proc.stdout:
                    tail = (tail + [line.rstrip()])[-8:]
                    if line.startswith("[bench "):  # progress; under emulation without its figures
                        shown = line.split(" ... ")[0] + " ... ran (emulated: not timed)" if run.emulated else line.strip()
                        log(f"[fanout] {run.target.label}: {shown}")
            finally:
                watchdog.cancel()
                watchdog.join()  # a stop() under way finishes its removal before ours below
        if timed_out.is_set():
            raise TargetFailed("bench did not finish in time (--timeout); its container was removed")
        if proc.returncode != 0:
            said = " | ".join(t for t in tail if t.strip())[-400:]
            hint = ""
            if run.emulated and "exec format error" in said:
                hint = (f"; that daemon cannot run {run.arch} binaries: register qemu-user there "
                        f"(`python -m lab.emulation install {run.arch}` on that host)")
            raise TargetFailed(f"bench exited {proc.returncode}: {said}{hint}")
        docker._docker("cp", f"{container}:/tmp/out/.", str(out), host=run.target.host, timeout=left())
    finally:
        docker._docker("rm", "-f", container, host=run.target.host, timeout=60, check=False)


def run_one(run: HostRun, bench_args: list[str], registry: str | None, timeout: float, log) -> None:
    """One target, from its image check to its rows in `run` (or its error); bounded by `timeout`."""
    from lab import docker
    from lab.files import read_csv

    target = run.target
    deadline = time.monotonic() + timeout

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TargetFailed(f"no answer within {timeout:.0f} s")
        return remaining

    try:
        run.image = ensure_image(run, registry, left, log)
        found = docker.image_architecture(run.image, host=target.host)
        native = MACHINE_OF.get(run.info.get("Architecture"))
        run.emulated = not (found and native and found == native)  # unknown counts as emulated: never timed
        log(f"[fanout] {target.label}: {run.image} ({found}) on {run.info.get('Name')} ({run.info.get('Architecture')})"
            + (": under emulation, so it runs a short pass that proves the image works and is not timed"
               if run.emulated else ""))
        with tempfile.TemporaryDirectory(prefix="fanout-") as tmp:
            run_bench(run, EMULATED_ARGS if run.emulated else bench_args, Path(tmp), left, log)
            rows_file = next(Path(tmp).glob("*/bench.csv"), None)
            if rows_file is None:
                raise TargetFailed("bench wrote no rows")
            run.rows = read_csv(rows_file)
            run.samples = [] if run.emulated else read_csv(rows_file.with_name("samples.csv"))
    except TargetFailed as exc:
        run.error = str(exc)
    except Exception as exc:  # one target's failure, whatever it is, fails that target only
        run.error = f"{type(exc).__name__}: {exc}"
    machine = {v: k for k, v in MACHINE_OF.items()}.get(run.arch, run.arch)
    for row in run.rows:
        row.update(host=run.host_id, arch=machine)
        if run.emulated:
            row.update({column: "" for column in EMULATED_EMPTY}, timing_method=EMULATED_METHOD)


def land(runs: list[HostRun], results: Path) -> list[Path]:
    """Each successful host's rows into results/<entry>/<host-id>/, then the aggregate and the chart."""
    from lab.files import upsert_csv

    from infer.rows import COLUMNS, KEY, SAMPLE_COLUMNS, write_aggregate

    written = []
    for run in runs:
        if run.error:
            continue
        folder = results / run.target.entry / run.host_id
        if run.samples:  # samples first, as rows.write: bench.csv never names samples that are not there
            upsert_csv(folder / "samples.csv", run.samples, SAMPLE_COLUMNS, KEY)
        upsert_csv(folder / "bench.csv", run.rows, COLUMNS, KEY)
        written.append(folder / "bench.csv")
    if written:
        write_aggregate(results)
        from .report import charts_possible

        if charts_possible() and across_hosts(results) is None:
            (results / "across_hosts.png").unlink(missing_ok=True)  # no activation rows: no stale chart either
    return written


def host_rows(results: Path) -> list[dict]:
    from lab.files import read_csv

    return [r for p in sorted(Path(results).glob("*/*/bench.csv")) for r in read_csv(p)]


def across_hosts(results: Path) -> Path | None:
    """results/across_hosts.png: the four rows of the activation (those measured) for every host and
    architecture a fan-out measured, one panel per device (newest opset each); emulated hosts are
    named, not drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .report import FOUR_ROWS, _opsets, _pick

    rows = [r for r in host_rows(results) if r["workload"] == PRIMARY and not r.get("isa")]
    if not rows:
        return None
    devices = sorted({r["device"] for r in rows})
    fig, axes = plt.subplots(len(devices), 1, figsize=(9, 3.6 * len(devices)), squeeze=False)
    # The infer image is torch-free: the rows it measures, and ORT's copy floor beside them.
    shown = [(label, row, level) for label, row, level in FOUR_ROWS + [("copy floor, ONNX Runtime (Identity)", "ort_copy", "all")]
             if any(r["row"] == row for r in rows)]
    labels = [label for label, _, _ in shown]
    for ax, device in zip(axes[:, 0], devices):
        mine = [r for r in rows if r["device"] == device]
        hosts = sorted({(r["entry"], r["host"]) for r in mine})
        width = 0.8 / max(len(hosts), 1)
        emulated = []
        for i, (entry, host) in enumerate(hosts):
            chosen = [r for r in mine if (r["entry"], r["host"]) == (entry, host)]
            if all(r["timing_method"] == EMULATED_METHOD for r in chosen):
                emulated.append(f"{entry} on {host}")
                continue
            opset = (_opsets(chosen) or [""])[-1]
            values = [float(r["p50_ms"]) if (r := _pick(chosen, row, level, "opset", opset)) and r["p50_ms"] else 0.0
                      for _, row, level in shown]
            ax.bar([x + i * width for x in range(len(labels))], values, width=width,
                   label=f"{entry} on {host} ({chosen[0]['arch']}, opset {opset})")
        ax.set_xticks([x + width * (len(hosts) - 1) / 2 for x in range(len(labels))], labels, fontsize=7, rotation=12)
        ax.set_ylabel("p50 latency (ms)")
        ax.set_title(f"{device}: activation 8x512x768 float32", fontsize=9)
        if emulated:
            ax.text(0.99, 0.97, "ran under emulation, not timed: " + "; ".join(emulated), transform=ax.transAxes,
                    ha="right", va="top", fontsize=7)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(results) / "across_hosts.png"
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
    return path


def _facts_or_error(target: Target) -> dict | str:
    try:
        return daemon_facts(target.host, 30)
    except TargetFailed as exc:
        return str(exc)


def run(specs: list[str], bench_args: list[str], *, results: Path, registry: str | None = None,
        timeout: float = 3600, log=print) -> int:
    """Every target at once; returns 0 when all landed, 1 when any failed (the others' results landed)."""
    targets = []
    for spec in specs:
        target = parse_target(spec)
        if target.kind != "docker":
            raise ValueError(f"--on {spec}: a fan-out target is a Docker daemon (this machine's own rows come "
                             "from `nox -s bench` without --on)")
        targets.append(target)
    if len({t.label for t in targets}) < len(targets):
        raise ValueError("the same --on target is given twice")
    runs = [HostRun(t) for t in targets]
    # Who each daemon is, first: the folder each run writes, and which runs share a machine.
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(runs)) as pool:
        facts = list(pool.map(lambda r: _facts_or_error(r.target), runs))
    seen: dict = {}
    for r, found in zip(runs, facts):
        if isinstance(found, str):
            r.error = found
            continue
        r.info, r.arch = found, image_arch(r.target, found)
        r.host_id = host_id(found, r.arch)
        if r.host_id in seen:  # two spellings of one daemon and architecture would write one folder twice
            r.error = f"the same daemon and architecture as {seen[r.host_id]} ({r.host_id}): give each once"
        seen.setdefault(r.host_id, r.target.label)
    # Machines at once; on one machine one run after another (native first), so none times another's load.
    by_machine: dict = {}
    for r in runs:
        if not r.error:
            by_machine.setdefault(r.machine, []).append(r)
    for group in by_machine.values():
        group.sort(key=lambda r: MACHINE_OF.get(r.info.get("Architecture")) != r.arch)
    log(f"[fanout] {len(runs)} target(s) on {len(by_machine)} machine(s), machines at once, each target within "
        f"{timeout:.0f} s: " + "; ".join(" then ".join(r.target.label for r in g) for g in by_machine.values()))
    if by_machine:
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(by_machine)) as pool:
            list(pool.map(lambda g: [run_one(r, bench_args, registry, timeout, log) for r in g], by_machine.values()))
    written = land(runs, results)
    for r in runs:
        if r.error:
            log(f"FAIL {r.target.label}: {r.error}")
        else:
            log(f"[fanout] {r.target.label}: {len(r.rows)} rows in {results / r.target.entry / r.host_id}"
                + (" (emulated: not timed)" if r.emulated else ""))
    if written:
        chart = results / "across_hosts.png"
        log(f"[fanout] {len(written)} host(s) merged into {results / 'bench_all.csv'}"
            + (f" and {chart}" if chart.exists() else " (no chart: matplotlib is missing)"))
    failed = [r for r in runs if r.error]
    log(f"[fanout] {len(runs) - len(failed)} of {len(runs)} target(s) landed" + (f", {len(failed)} failed" if failed else ""))
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="nox -s bench -- --on TARGET", description=__doc__.splitlines()[0])
    parser.add_argument("--on", action="append", required=True, metavar="TARGET",
                        help="a Docker target, as for cross_machine_diff (docker, context:NAME, unix://, tcp://, "
                             "ssh://user@host), with @ENTRY or @ENTRY/ARCH; give it once per host")
    parser.add_argument("--registry", help="pull a missing image from here (where `nox -s publish` pushed it); "
                                           "default: copy it from this machine's daemon")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds each target may take in all")
    parser.add_argument("--results", type=Path, default=Path(__file__).resolve().parent.parent / "results")
    runner = parser.add_argument_group("passed to the infer image's bench")
    runner.add_argument("--workload", nargs="+", choices=sorted(WORKLOADS))
    for name in ("--threads", "--warmup", "--runs", "--ffn-warmup", "--ffn-runs", "--opset"):
        runner.add_argument(name, type=int)
    runner.add_argument("--exporter", choices=["dynamo", "torchscript"])
    args = parser.parse_args(argv)
    bench_args = []
    for name in ("workload", "threads", "warmup", "runs", "ffn_warmup", "ffn_runs", "opset", "exporter"):
        value = getattr(args, name)
        if value is not None:
            bench_args += [f"--{name.replace('_', '-')}", *map(str, value if isinstance(value, list) else [value])]
    try:
        return run(args.on, bench_args, results=args.results, registry=args.registry, timeout=args.timeout,
                   log=lambda message: print(message, flush=True))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
