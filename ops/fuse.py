"""Rewrite an ONNX file a user already has so that each op's decomposed forms become one myops node:
`nox -s fuse -- IN.onnx OUT.onnx` runs `python -m ops.fuse IN.onnx OUT.onnx`.

The rules are onnxscript pattern-rewriter rules, read from each op's declaration (its decomposed form
and fused nodes, made into rules by ops/onnx_parts.py) for the forms the exporters and ORT's optimizer
write. A match whose constants cannot be read (an epsilon or a beta that is a graph input or computed
at run time) is refused with the reason, never guessed. OUT is then run against IN in ONNX Runtime,
the plugin registered, on random inputs at two shapes, and it is written only when every output agrees
within layer 2's tolerance.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lab.files import write_text_atomic
from opspec import DOMAIN, DOMAIN_VERSION

# what a rule's check reads of a match
from .onnx_parts import float_input, same_shapes, scalar, where  # noqa: F401

# Layer 2's tolerance (tests/test_alignment_onnx.py): ORT with the plugin against its reference.
RTOL, ATOL = 1e-4, 1e-5
# Symbolic dimensions of the inputs take these values, in order of first appearance, in the two proofs;
# integer inputs (token ids, positions) are drawn from [0, int_high).
PROOF_DIMS = ((2, 7, 3, 5, 4), (3, 11, 2, 6, 5))


class FuseError(RuntimeError):
    """The file could not be rewritten, or the rewrite could not be proven: nothing was written."""


@dataclass
class FuseReport:
    """What the rules did: replacements per (op, form), refusals with their reason and where."""
    replaced: Counter = field(default_factory=Counter)
    refused: dict = field(default_factory=dict)  # (op, form, where) -> reason

    def replace(self, op: str, form: str) -> None:
        self.replaced[(op, form)] += 1

    def refuse(self, op: str, form: str, where: str, reason: str) -> None:
        self.refused[(op, form, where)] = reason

    def lines(self) -> list[str]:
        lines = [f"replaced {n} x {form} -> {DOMAIN}::{op}" for (op, form), n in sorted(self.replaced.items())]
        lines += [f"refused {form} at {where} ({DOMAIN}::{op}): {reason}"
                  for (op, form, where), reason in sorted(self.refused.items())]
        return lines or ["no decomposed form of any op was found"]


def rules(report: FuseReport, ops: list[str] | None = None) -> list:
    """The rules of the ops asked for; by default of every op whose ONNX module does not say
    FUSE_BY_DEFAULT = False (a scaffolded op whose math is still the identity)."""
    from .registry import OPS

    chosen = ops or [name for name, op in OPS.items() if getattr(op.onnx, "FUSE_BY_DEFAULT", True)]
    found = []
    for name in chosen:
        make = getattr(OPS[name].onnx, "fuse_rules", None)
        if make is not None:
            found += make(report)
    return found


def rewrite(model, report: FuseReport, ops: list[str] | None = None, extra_rules: list | None = None) -> int:
    """Rewrite an onnx_ir Model in place; the myops opset import added where a rule fired. Returns how
    many subgraphs were replaced."""
    from onnxscript import rewriter

    from .registry import OPS

    for op in OPS.values():
        op.onnx.register_schema()
    chosen = rules(report, ops) + list(extra_rules or [])
    if not chosen:
        return 0
    count = apply_rules(model, chosen)
    from onnx_ir.passes.common import RemoveUnusedNodesPass

    RemoveUnusedNodesPass()(model)
    if count:
        model.opset_imports[DOMAIN] = DOMAIN_VERSION
    return count


def apply_rules(model, chosen: list) -> int:
    """The rules on an onnx_ir Model; how many subgraphs they replaced. Commuted: Mul(x, Sigmoid(x)) and
    Mul(Sigmoid(x), x) alike, each rule written once. Whole forms first: a form with an attribute's
    identity node left out may match inside a whole one (at an inner node, which the rewriter reaches
    first) and would leave that node beside the fused one."""
    from onnxscript import rewriter

    count = 0
    for identity_variants in (False, True):
        tier = [rule for rule in chosen if getattr(rule, "myops_identity_variant", False) == identity_variants]
        if tier:
            count += rewriter.RewriteRuleSet(tier, commute=True).apply_to_model(model)
    return count


def node_types(model) -> Counter:
    return Counter(f"{n.domain}::{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type
                   for n in model.graph)


# ---------------------------------------------------------------- the proof in ONNX Runtime

def prove(before: str | bytes, after: str | bytes, plugin: str | None, *, int_high: int, threads: int = 0) -> list[str]:
    """Run both files in ORT (the plugin registered) at two shapes; FuseError where an output differs."""
    from infer.model_files import FeedShapeError, feeds
    from infer.model_files import session as ort_session

    def session(model):
        try:
            return ort_session(model, plugin, threads=threads)
        except Exception as exc:  # onnxruntime's own exception types
            raise FuseError(f"ONNX Runtime cannot load the {'rewritten' if model is after else 'input'} file: "
                            f"{str(exc).splitlines()[0]}") from None

    base, fused = session(before), session(after)
    lines = []
    for k, dims in enumerate(PROOF_DIMS):
        try:
            feed = feeds(base, dims, int_high=int_high, seed=k)
        except FeedShapeError as exc:
            raise FuseError(f"the proof cannot feed this file: {exc}") from None
        try:
            expected = base.run(None, feed)
        except Exception as exc:  # onnxruntime's own exception types
            raise FuseError(f"the input file does not run on random inputs with shapes "
                            f"{ {n: list(v.shape) for n, v in feed.items()} }: {str(exc).splitlines()[0]}; "
                            "give --int-high (token ids) or fixed input shapes") from None
        try:
            got = fused.run(None, feed)
        except Exception as exc:  # onnxruntime's own exception types
            raise FuseError(f"the rewritten file fails to run where the input file runs: {str(exc).splitlines()[0]}; "
                            "a rule matched something its op cannot take, so the rewrite is refused") from None
        shapes = ", ".join(f"{n} {'x'.join(map(str, v.shape))}" for n, v in feed.items())
        for meta, want, have in zip(base.get_outputs(), expected, got, strict=True):
            if want.dtype.kind != "f":
                if not np.array_equal(want, have):
                    raise FuseError(f"output {meta.name} differs at {shapes}")
                continue
            if have.shape != want.shape or not np.allclose(have, want, rtol=RTOL, atol=ATOL):
                worst = float(np.abs(have.astype(np.float64) - want).max()) if have.shape == want.shape else float("nan")
                raise FuseError(f"output {meta.name} differs at {shapes}: max abs {worst:.3e} (rtol {RTOL}, atol {ATOL}); "
                                "the rewrite changes results, so it is refused")
        worst = max((float(np.abs(h.astype(np.float64) - w).max()) for w, h in zip(expected, got) if w.dtype.kind == "f"
                     and w.size), default=0.0)
        lines.append(f"proved at {shapes}: max abs {worst:.1e} (rtol {RTOL}, atol {ATOL})")
    return lines


# ---------------------------------------------------------------- the file

@dataclass
class FuseResult:
    path: Path
    report: FuseReport
    before: Counter
    after: Counter
    proof: list[str]


def fuse(source: str | os.PathLike, target: str | os.PathLike, *, plugin: str | None = None, ops: list[str] | None = None,
         int_high: int = 32, extra_rules: list | None = None, log=print) -> FuseResult:
    """Rewrite `source` into `target`, prove it, then move it into place; FuseError (nothing written) else."""
    import onnx_ir as ir

    source, target = Path(source), Path(target)
    if not source.is_file():
        raise FuseError(f"{source} is not a file")
    if source.resolve() == target.resolve():
        raise FuseError("OUT must differ from IN: the input is what the rewrite is proven against")
    try:
        model = ir.load(source)
    except Exception as exc:  # onnx's and onnx_ir's own parse errors
        raise FuseError(f"{source} is not an ONNX model onnx_ir can read: {str(exc).splitlines()[0]}") from None
    external = any(isinstance(value.const_value, ir.ExternalTensor) for value in model.graph.initializers.values())
    if external:  # what ORT refuses (a data file missing, or outside the model's folder), refused first
        from ort_plugin.onnx_file import external_data_problems, read_model

        problems, _ = external_data_problems(source, read_model(source))
        if problems:
            raise FuseError("; ".join(problems))
    before = node_types(model)
    report = FuseReport()
    count = rewrite(model, report, ops, extra_rules)
    after = node_types(model)
    for line in report.lines():
        log(f"[fuse] {line}")
    if not count:
        raise FuseError("nothing to replace: " + "; ".join(report.lines()))
    if external:
        proof = _write_with_external_data(model, source, target, plugin, int_high)
    else:
        proto = ir.serde.serialize_model(model)
        _check(proto)
        data = proto.SerializeToString()
        proof = prove(str(source), data, plugin, int_high=int_high)
        write_text_atomic(target, data)
    for line in proof:
        log(f"[fuse] {line}")
    return FuseResult(target, report, before, after, proof)


def _check(model) -> None:
    import onnx

    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise FuseError(f"the rewritten model fails onnx.checker: {str(exc).splitlines()[0]}") from None


def _write_with_external_data(model, source: Path, target: Path, plugin: str | None, int_high: int) -> list[str]:
    """As the input was written: the weights in OUT.onnx.data beside OUT.onnx. Both are written in a
    folder of their own beside the target and proven there; a failure leaves the target as it was.
    Then an earlier OUT.onnx goes first, the data file moves in, the model last: an interrupt between
    can leave a data file without its model, never a model that reads another's data."""
    import shutil
    import tempfile

    import onnx_ir as ir

    data_name = f"{target.name}.data"
    made = [p for p in (target.parent, *target.parent.parents) if not p.exists()]
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
    try:
        ir.save(model, staging / target.name, external_data=data_name)
        _check(str(staging / target.name))  # a path: its data file is read beside it
        proof = prove(str(source), str(staging / target.name), plugin, int_high=int_high)
        target.unlink(missing_ok=True)
        if (staging / data_name).exists():
            os.replace(staging / data_name, target.parent / data_name)
        os.replace(staging / target.name, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        for folder in made:  # the folders this call made, when nothing else is in them
            if folder.exists() and not any(folder.iterdir()):
                folder.rmdir()
        raise
    shutil.rmtree(staging, ignore_errors=True)
    return proof


def main(argv: list[str] | None = None) -> int:
    from .registry import OPS

    parser = argparse.ArgumentParser(prog="python -m ops.fuse", description=__doc__.splitlines()[0])
    parser.add_argument("source", metavar="IN.onnx")
    parser.add_argument("target", metavar="OUT.onnx")
    parser.add_argument("--op", action="append", choices=list(OPS), help="only this op's rules (repeatable; default: all)")
    parser.add_argument("--plugin", help="the plugin library (default: $MYOPS_ORT_PLUGIN or the newest build)")
    parser.add_argument("--int-high", type=int, default=32,
                        help="integer inputs (token ids) are drawn from [0, N) in the proof (default 32; masks: 0 or 1)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        result = fuse(args.source, args.target, plugin=args.plugin, ops=args.op, int_high=args.int_high)
    except FuseError as exc:
        print(f"[fuse] FAIL: {exc}\n[fuse] nothing was written", file=sys.stderr)
        return 1
    changed = sorted(t for t in set(result.before) | set(result.after) if result.before[t] != result.after[t])
    print("[fuse] nodes: " + ", ".join(f"{t} {result.before[t]} -> {result.after[t]}" for t in changed))
    print(f"[fuse] wrote {result.path} ({time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
