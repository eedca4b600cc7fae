"""Performance targets as ratios of paired measurements: A, B, A, B ... in one process, one run.

The ratio of each pair is taken, and the median of those ratios is the figure: both sides see
the same machine state, so the ratio holds where absolute times drift. CPU default, activation
alone, float32. The pairs run in several fresh processes: a process's buffer addresses and thread
placement move a ratio by more than the pairs within it vary (one process alone gave intervals that
the next run's figure fell outside), so the 95% interval is a bootstrap over processes, then pairs
(bench.stats). Against a copy floor the denominators are every copy timed like the op, and the
fastest is the floor.

The pairs run in a child process (`python -m bench.targets SPEC`) whose ORT sessions share one
intra-op thread pool, as one process serving several models would. With a pool per session, the
pool that has just run keeps its threads spinning and, on a 2-core machine, slows whichever
session runs next: ratios then swung between 0.4x and 1.3x from one block of pairs to the next.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from infer.measure import timing_child_env
from infer.workloads import WORKLOADS

REPO = Path(__file__).resolve().parent.parent
PAIRS_TIMEOUT_S = 1800
ORT_THREAD_POOL = "one intra-op pool shared by the sessions"
TARGET_COLUMNS = ["entry", "op", "target", "numerator", "denominator", "shape", "median_ratio", "ci_low", "ci_high", "limit",
                  "holds", "pairs", "processes", "process_spread", "threads", "opset", "ort_thread_pool", "note",
                  "git_sha", "timestamp"]
# Each op declares its targets (opspec/<op>.py, or its TorchOp): (name, numerator, denominators, limit),
# holding when median(A/B) <= limit, measured at each of its op-alone workloads on the rows of
# _op_callables. Where several denominators are given they are the copies timed like the op, and the
# fastest of them (the largest ratio) is the floor; such a copy-floor target is measured again on a
# DRAM-sized tensor. A row "OTHER:ROW" is another op's on an input of the same shape ("rms_norm:ort_custom");
# "peak:ROW[@LEVEL]" is a row's peak memory in this run's fresh-process figures (LEVEL: ORT's optimisation
# level), a ratio of one measurement.
PEAK = "peak:"
COPY_NAMES = {"ort_plugin_copy": "the plugin's myops::Copy", "ort_copy": "ORT's Identity",
              "torch_copy_into": "copy_ into a preallocated tensor", "torch_copy": "clone"}


def target_status(ratio: float, limit: float) -> str:
    """'met (12.0 % under the limit)' or 'MISSED by 8.0 %': every target, CPU or GPU, is an upper
    bound on a ratio whose numerator is ours (the fused op, its plugin, its peak memory)."""
    margin = (limit - ratio) / limit * 100
    return f"met ({margin:.1f} % under the limit)" if ratio <= limit else f"MISSED by {-margin:.1f} %"


def _shared_ort_pool(threads: int) -> None:
    """Before the first session: every session of this process uses one global intra-op pool."""
    from onnxruntime.capi import _pybind_state

    _pybind_state.set_global_thread_pool_sizes(threads, 1)


def _setup(spec: dict) -> None:
    import torch

    import ops

    from infer.measure import keep_freed_blocks

    keep_freed_blocks()  # as in the rows' timing processes
    _shared_ort_pool(spec["threads"])
    torch.set_num_threads(spec["threads"])
    ops.load()


def _shared_pool_session(path: str, arrays: tuple, plugin: str | None = None):
    """One run of an ORT session on the process's shared intra-op pool (see _shared_ort_pool), fed
    `arrays` in the order of its graph inputs."""
    import onnxruntime as ort

    from ort_plugin import register

    options = ort.SessionOptions()
    options.use_per_session_threads = False
    options.log_severity_level = 3
    if plugin:
        register(options, plugin)
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    feed = dict(zip((i.name for i in session.get_inputs()), arrays))
    return lambda: session.run(None, feed)


def _op_callables(spec: dict, op_name: str, paths: dict, arrays: tuple, peers: bool = True) -> dict:
    """The rows an op's declared targets compare, on its op-alone workload's inputs (x first) and the
    weights its exported models hold. A row named "OTHER:ROW" is another op's row on an input of the same
    shape (RMSNorm's plugin beside a row-wise op's): present when one of OTHER's op-alone workloads ran
    in this bench at that shape."""
    import torch

    from ops.registry import OPS

    op = OPS[op_name]
    tensors = tuple(torch.from_numpy(a) for a in arrays)
    x = tensors[0]
    model = op.build_model(op.name, hidden=x.shape[-1], attributes={"beta": spec["beta"]})
    arguments = (*tensors, *(getattr(model, name).detach() for name in op.weights), *model.attribute_values)

    def session(path, with_plugin=False):
        return _shared_pool_session(path, arrays, spec["plugin"] if with_plugin else None)

    calls = {
        "ort_custom": session(paths["custom"], with_plugin=True),
        "ort_composite_all": session(paths["decomposed"]),
        "torch_extension": lambda: op.function(*arguments),
        "torch_composite": lambda: op.reference(*arguments),
    }
    if "newest_custom" in paths:  # the newest opset, whose decomposed lowering is the op's standard node
        calls["ort_custom_newest"] = session(paths["newest_custom"], with_plugin=True)
        calls["ort_standard"] = session(paths["newest_decomposed"])
    if op.native is not None and op.native_applies(op.attributes(beta=spec["beta"])):  # F.rms_norm: torch >= 2.4
        calls[op.spec.native_row] = lambda: op.native(*arguments)
    # The copy floors of an op-alone workload.
    out = torch.empty_like(x)
    calls.update(torch_copy=lambda: x.clone(), torch_copy_into=lambda: out.copy_(x))
    if "plugin_copy" in paths:
        calls["ort_plugin_copy"] = session(paths["plugin_copy"], with_plugin=True)
    if "copy" in paths:
        calls["ort_copy"] = session(paths["copy"])
    wanted = {row for _, numerator, denominators, _ in op.targets for row in (numerator, *denominators)
              if ":" in row and not row.startswith(PEAK)}
    for row in sorted(wanted) if peers else ():
        peer, peer_row = row.split(":", 1)
        same_shape = [(name, paths) for name, paths in spec["op_workloads"].items()
                      if WORKLOADS[name].op == peer and WORKLOADS[name].shape == tuple(x.shape)]
        if peer in OPS and same_shape:
            name, peer_paths = same_shape[0]
            peer_calls = _op_callables(spec, peer, peer_paths, WORKLOADS[name].inputs(seed=0), peers=False)
            if peer_row in peer_calls:
                calls[row] = peer_calls[peer_row]
    return calls


def paired_ratios(a, b, pairs: int, warmup: int = 10) -> list[float]:
    """t(a) / t(b) of each pair, timed back to back; the order alternates between pairs, so that
    neither side always inherits the other's cache and thread-pool state."""
    for _ in range(warmup):
        a()
        b()
    ratios = []
    for i in range(pairs):
        first, second = (a, b) if i % 2 == 0 else (b, a)
        start = time.perf_counter()
        first()
        middle = time.perf_counter()
        second()
        end = time.perf_counter()
        t_first, t_second = middle - start, end - middle
        ratios.append(t_first / t_second if i % 2 == 0 else t_second / t_first)
    return ratios


def paired_ratio(a, b, pairs: int, warmup: int = 10) -> float:
    """The median of paired_ratios: the figure a target is judged by."""
    return statistics.median(paired_ratios(a, b, pairs, warmup))


# The copy-floor targets once more on a tensor far beyond the last-level cache: at the default size
# the input and output sit in L3 on many CPUs, where the op's arithmetic, not memory, can set its
# pace; out there both are bound by DRAM bandwidth.
DRAM_VALUES = 65536 * 768   # 50,331,648 float32: 192 MiB in, 192 MiB out


def _dram_shape(hidden: int) -> tuple:
    """That many values as one batch of rows of the workload's hidden size (a row-wise op's weights fit)."""
    return (1, DRAM_VALUES // hidden, hidden)


def _copy_floor(target) -> bool:
    return all(d in COPY_NAMES for d in target[2])


def _paired(op) -> list:
    return [t for t in op.targets if not t[1].startswith(PEAK)]


def _child(spec: dict) -> list[dict]:
    import numpy as np

    from ops.registry import OPS

    _setup(spec)
    measured = []
    for name, paths in spec.get("op_workloads", {}).items():
        workload = WORKLOADS[name]
        op = OPS[workload.op]
        measured += _measure(spec, _op_callables(spec, workload.op, paths, workload.inputs(seed=0)), _paired(op),
                             spec["pairs"], shape="x".join(map(str, workload.shape)), op=workload.op)
        dram = _dram_shape(workload.shape[-1])
        floors = [(f"{t[0]} (DRAM-sized tensor, {'x'.join(map(str, dram))})", *t[1:]) for t in _paired(op)
                  if _copy_floor(t)]
        if spec.get("dram") and floors and name == spec["dram_workloads"].get(workload.op):
            rng = np.random.default_rng(1)
            large = tuple(rng.standard_normal(dram, dtype=np.float32) for _ in op.spec.graph_inputs)
            measured += _measure(spec, _op_callables(spec, workload.op, paths, large, peers=False), floors,
                                 max(10, spec["pairs"] // 10), shape="x".join(map(str, dram)), op=workload.op,
                                 warmup=3)
    return measured


def _measure(spec: dict, calls: dict, targets: list, pairs: int, shape: str, op: str, warmup: int = 10) -> list[dict]:
    """This process's paired ratios of every target, per denominator."""
    measured = []
    for name, numerator, denominators, limit in targets:
        present = [d for d in denominators if d in calls]
        if numerator not in calls or not present:
            missing = [r for r in (numerator, *denominators) if r not in calls]
            if any(":" in r for r in missing):  # another op's row: that op's workload was not in this run
                print(f"[targets] {name}: not measured: {', '.join(missing)} need that op's workload in the run "
                      f"(--workload {op} {' '.join(sorted({r.split(':')[0] for r in missing if ':' in r}))})",
                      file=sys.stderr, flush=True)
            continue
        by_floor = {d: paired_ratios(calls[numerator], calls[d], pairs, warmup=warmup) for d in present}
        measured.append(dict(target=name, op=op, numerator=numerator, by_floor=by_floor, limit=limit, pairs=pairs,
                             shape=shape))
    return measured


def combine(per_process: list[list[dict]]) -> list[dict]:
    """One figure per target from every process's pairs: the pooled median ratio, its hierarchical interval,
    and, against several copies, the fastest copy as the floor (the one the op's ratio is largest against)."""
    from .stats import summarise

    combined = []
    for first in per_process[0]:
        mine = [m for process in per_process for m in process
                if (m["op"], m["target"], m["shape"]) == (first["op"], first["target"], first["shape"])]
        groups = {d: [m["by_floor"][d] for m in mine] for d in first["by_floor"]}
        pooled = {d: statistics.median([r for g in gs for r in g]) for d, gs in groups.items()}
        denominator = max(pooled, key=pooled.get)
        summary = summarise(groups[denominator])
        note = "; ".join(f"vs {COPY_NAMES.get(d, d)}: {r:.3f}x" for d, r in pooled.items()) if len(pooled) > 1 else ""
        combined.append(dict(first, denominator=denominator, ratio=summary.median, ci_low=summary.ci_low,
                             ci_high=summary.ci_high, processes=summary.processes,
                             process_spread=summary.process_spread, note=note))
    return combined


def _peak_key(row: str, opset) -> tuple:
    """A "peak:ROW[@LEVEL]" row as bench.csv keys it: (row, ORT level, opset); PyTorch rows have neither."""
    name, _, level = row[len(PEAK):].partition("@")
    return (name, level, str(opset)) if level else (name, "", "")


def measure_targets(args, models: dict, plugin: str, rows: list[dict], facts: dict) -> list[dict]:
    from ops.registry import OPS

    # Each op with declared targets, at the newest opset whose decomposed graph is the op's composite (not
    # a standard node that replaces it), at each of its op-alone workloads; the newest opset too, where it is
    # one whose decomposed lowering is that standard node (Swish-24: rows ort_custom_newest, ort_standard).
    op_opsets, op_newest = {}, {}
    for op in OPS.values():
        opsets = sorted({o for (name, o) in models if WORKLOADS[name].op == op.name and WORKLOADS[name].op_alone})
        composite = [o for o in opsets if not op.onnx.uses_standard(o, args.exporter)]
        if op.targets and composite:
            op_opsets[op.name] = composite[-1]
            if opsets[-1] != composite[-1]:
                op_newest[op.name] = opsets[-1]
    op_workloads = {}
    for (name, o), paths in models.items():
        op = WORKLOADS[name].op
        if op_opsets.get(op) == o and WORKLOADS[name].op_alone:
            op_workloads[name] = {key: str(value) for key, value in paths.items()}
            if op in op_newest:
                op_workloads[name].update(newest_custom=str(models[(name, op_newest[op])]["custom"]),
                                          newest_decomposed=str(models[(name, op_newest[op])]["decomposed"]))
    # the copy-floor targets on a DRAM-sized tensor: once per op, at its first op-alone workload
    dram_workloads = {}
    for name in op_workloads:
        dram_workloads.setdefault(WORKLOADS[name].op, name)
    spec = dict(threads=args.threads, beta=args.beta, pairs=args.pairs, plugin=str(plugin), op_workloads=op_workloads,
                dram=not getattr(args, "quick", False), dram_workloads=dram_workloads)
    processes = getattr(args, "target_processes", 3)
    print(f"[bench] paired target ratios ({args.pairs} alternating pairs each in {processes} processes, opset "
          f"{', '.join(f'{op}: {o}' for op, o in op_opsets.items())}, ORT sessions sharing one thread pool):", flush=True)
    env = timing_child_env(REPO)
    per_process = []
    for number in range(1, processes + 1):
        started = time.perf_counter()
        child = subprocess.run([sys.executable, "-m", "bench.targets", json.dumps(spec)], stdout=subprocess.PIPE,
                               text=True, timeout=PAIRS_TIMEOUT_S, env=env, cwd=REPO)
        if child.returncode != 0:
            raise RuntimeError(f"the paired target ratios failed (exit status {child.returncode}); see the lines above")
        per_process.append(json.loads(child.stdout.strip().splitlines()[-1]))
        print(f"[targets {number}/{processes}] ({time.perf_counter() - started:.0f} s)", flush=True)
    results = []
    for m in combine(per_process) if per_process and per_process[0] else []:
        print(f"  {m['target'] + ' ' + m['shape']:64} {m['ratio']:6.3f}x [{m['ci_low']:.3f}-{m['ci_high']:.3f}]  (target <= {m['limit']}x)  "
              f"{'OK' if m['ratio'] <= m['limit'] else 'MISSED'}  {m['note']}", flush=True)
        results.append(dict(entry=args.entry, op=m["op"], target=m["target"], numerator=m["numerator"],
                            denominator=m["denominator"], shape=m["shape"], median_ratio=round(m["ratio"], 4),
                            ci_low=round(m["ci_low"], 4), ci_high=round(m["ci_high"], 4), limit=m["limit"],
                            holds=m["ratio"] <= m["limit"], pairs=m["pairs"], processes=m["processes"],
                            process_spread=round(m["process_spread"], 4), threads=args.threads,
                            opset=op_newest[m["op"]] if m["numerator"].endswith("_newest") else op_opsets[m["op"]],
                            ort_thread_pool=ORT_THREAD_POOL, note=m["note"], git_sha=facts["git_sha"],
                            timestamp=facts["timestamp"]))
    # Peak memory: the fresh-process figures of this run, at each op's first op-alone workload.
    for op_name, workload in dram_workloads.items():
        opset = op_opsets[op_name]
        peaks = {(r["row"], r.get("ort_opt_level") or "", str(r.get("opset") or "")): r["peak_mb"] for r in rows
                 if r["workload"] == workload and not r.get("isa")}
        for name, numerator, denominators, limit in OPS[op_name].targets:
            if not numerator.startswith(PEAK):
                continue
            fused, composite = _peak_key(numerator, opset), _peak_key(denominators[0], opset)
            if fused in peaks and composite in peaks:
                ratio = peaks[fused] / peaks[composite] if peaks[composite] else float("inf")
                holds = ratio <= limit
                print(f"  {name:48} {peaks[fused]:.1f} MB vs {peaks[composite]:.1f} MB  {'OK' if holds else 'MISSED'}",
                      flush=True)
                results.append(dict(entry=args.entry, op=op_name, target=name, numerator=fused[0],
                                    denominator=composite[0], shape="x".join(map(str, WORKLOADS[workload].shape)),
                                    median_ratio=round(ratio, 4), limit=limit, holds=holds, pairs=1,
                                    threads=args.threads, opset=opset, ort_thread_pool="", git_sha=facts["git_sha"],
                                    timestamp=facts["timestamp"]))
    return results


if __name__ == "__main__":
    print(json.dumps(_child(json.loads(sys.argv[1]))), flush=True)
