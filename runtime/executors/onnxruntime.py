"""ONNX Runtime executor: runs one partition's ``.onnx`` model.

``onnxruntime`` (and ``onnx``, used only to vet external-data paths) are imported
inside ``load`` so a device without them can still run other backends.

The executor's ``report()``: providers requested / available / used, fallback settings,
and ``placement`` ({provider: {"nodes": n, "op_types": {...}}}, empty when this
onnxruntime cannot say which provider runs which node). Its ``session`` is the
InferenceSession itself (`exporter bench` times plain ORT on it). It takes and gives torch
tensors, or numpy arrays when loaded with ``arrays=True`` (a device without torch).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, Callable

from runtime.errors import ArtifactError, CompatibilityError, ExecutionError
from runtime.executors.meta import Entry, PartitionMeta
from runtime.executors.ort_kernels import check_kernels, register_kernels
from runtime.executors.ort_shared import supply_shared
from runtime.executors.ort_threads import intra_op_threads
from runtime.format.manifest import Partition
from runtime.memory.shared_weights import SharedWeights, missing_store

log = logging.getLogger(__name__)

CPU = "CPUExecutionProvider"
# onnxruntime validates external-data paths itself since PR #26776 (Dec 2025, 1.24);
# older versions follow "../x" or "/etc/x" as written, so without `onnx` to check
# the paths first, only those versions are trusted with external data.
_ORT_CHECKS_PATHS = (1, 24)


@dataclass(frozen=True)
class OnnxRuntimeMeta(PartitionMeta):
    model: Entry  # the .onnx file
    # External-data file names next to the model (not entry names: ORT opens them
    # relative to the model, after _check_external_data vets each location).
    external_data: tuple[str, ...] | None = None
    providers: tuple[str, ...] | None = None  # execution providers, in order; None: CPU
    opset: int | None = None
    fallback: str | None = None  # "allow", "warn" or "forbid" (the build's --fallback)
    disable_cpu_ep_fallback: bool = False  # "forbid": ORT may not put nodes on the CPU
    onnxruntime: str | None = None  # versions the build used (report, `exporter bundle`)
    onnx: str | None = None
    quantization: dict | None = None  # what ORT's quantizer did, when the build quantized
    # graph output -> the input whose memory it is written into: a KV-cache buffer that a
    # GroupQueryAttention updates in place (targets/onnx/contrib_ops.py). Not returned.
    in_place: dict[str, str] | None = None
    # Partition outputs the graph does not return because the kernel stored them in its
    # cache inputs (targets/onnx/stored_rows.py), by index, ascending: output
    # ``stored_outputs[k]`` is input ``stored_into[k]``'s rows p..p+T-1 along dim 2, where
    # p is element 0 of input ``rows_start`` and T its length. Returned as views of those.
    stored_outputs: tuple[int, ...] | None = None
    stored_into: tuple[int, ...] | None = None
    rows_start: int | None = None
    # The shared initializers' external data are files named by ort_shared.shared_location,
    # which the executor supplies from the store's memory (read in place, not copied).
    shared_files: bool | None = None
    # The project's own kernels (targets/onnx/kernels): a custom-op library compiled for
    # ``kernels_platform``, needing ``kernels_cpu_flags``; {op type: nodes} it runs
    kernels: Entry | None = None
    kernels_platform: str | None = None
    kernels_isa: str | None = None
    kernels_cpu_flags: tuple[str, ...] | None = None
    kernels_nodes: dict[str, int] | None = None


class OnnxRuntimeExecutor:
    # ``__call__`` is a slot holding the hot path's plain function (ort_binding.py), not a
    # method: ``executor(inputs)`` works as for any class, and Program, which resolves
    # ``executor.__call__`` once, calls that function directly, without the method layer
    # (a method lookup a call, felt by a model of microseconds).
    __slots__ = ("__call__", "session", "_report", "_weights")
    Meta = OnnxRuntimeMeta
    arena_slots = 0  # ORT allocates its own memory
    arrays = True  # runs on numpy arrays where torch is missing (runtime/program/requires.py)
    portable = True  # an ONNX graph: no native code, loads on any platform ORT runs on,
    # unless the partition carries our kernel library (native_code)

    @staticmethod
    def native_code(meta: dict) -> bool:
        """Whether the partition's files hold compiled code: our kernels' library."""
        return bool(meta.get("kernels"))

    def __init__(self, run, session, report: dict, weights: list | None = None) -> None:
        self.__call__ = run
        self.session = session  # for `exporter bench`: plain ORT on this very session
        self._report = report
        # shared initializers: the session reads these buffers, not copies, so they live
        # as long as the executor (ort_shared.py)
        self._weights = weights or []

    def report(self) -> dict:
        return dict(self._report)

    @classmethod
    def load(cls, partition: Partition, meta: OnnxRuntimeMeta, files_dir: Path, *, where: str,
             providers: list[str] | None = None, arrays: bool = False,
             shared: SharedWeights | None = None, **_: object) -> OnnxRuntimeExecutor:
        try:
            import onnxruntime as ort
        except ImportError:
            raise CompatibilityError(
                f"partition '{partition.name}' runs on ONNX Runtime, which is not installed",
                where=where, hint="install onnxruntime (pip install onnxruntime)") from None
        model = files_dir / meta.model
        where = f"{where}: {meta.model}"
        _check_external_data(model, where, ort.__version__)
        check_kernels(meta, partition.name, where)  # before any library is loaded

        requested = list(providers or meta.providers or [CPU])
        forbid = meta.disable_cpu_ep_fallback
        available = ort.get_available_providers()
        missing = [p for p in requested if p not in available]
        if missing and forbid:
            raise CompatibilityError(
                f"partition '{partition.name}' requires execution provider(s) "
                f"{', '.join(missing)}, which this onnxruntime lacks, and forbids CPU fallback",
                where=where, hint=f"install an onnxruntime build with them (this one has: "
                                  f"{', '.join(available)}) or rebuild with fallback 'allow'")
        for name in missing:
            log.warning("partition '%s': execution provider %s is not available here (have: "
                        "%s); its nodes run on %s", partition.name, name, ", ".join(available),
                        CPU)
        # Unavailable providers are dropped here, not by ORT (which would only warn).
        usable = [p for p in requested if p in available] or [CPU]

        shared_tensors = _shared_tensors(partition, meta, shared, where)
        session, records, no_fallback, weights = _open_session(
            ort, model, partition, usable, forbid, where, shared_tensors, meta.shared_files,
            kernels=files_dir / meta.kernels if meta.kernels else None)
        placement = _placement(session) if records else {}
        report = {"requested": requested, "available": available, "missing": missing,
                  "used": list(session.get_providers()), "disable_cpu_ep_fallback": no_fallback,
                  "fallback": meta.fallback or "allow", "placement_recorded": records,
                  "placement": placement,
                  # ort_threads.py: the CPU mask's physical cores, or OMP_NUM_THREADS
                  "intra_op_threads": session.get_session_options().intra_op_num_threads}
        log.info("partition '%s' on ONNX Runtime %s: requested %s, session uses %s",
                 partition.name, ort.__version__, requested, report["used"])
        on_cpu = placement.get(CPU, {}).get("nodes", 0)
        if on_cpu and CPU not in requested and report["fallback"] == "warn":
            log.warning("partition '%s': %d node(s) fell back to %s", partition.name, on_cpu,
                        CPU)
        runner = _runner(ort, session, partition, where, arrays, meta)
        return cls(runner, session, report, weights)


def _shared_tensors(partition: Partition, meta: OnnxRuntimeMeta, shared: SharedWeights | None,
                    where: str) -> dict:
    """{initializer name: the shared store's CPU tensor} of this partition."""
    if not meta.shared_weights:
        return {}
    if shared is None:
        raise missing_store(partition.name, where=where)
    return shared.tensors(meta.shared_weights, "cpu", partition=partition.name)


def _open_session(ort, model: Path, partition: Partition, usable: list[str], forbid: bool,
                  where: str, shared_tensors: dict, shared_files: bool | None,
                  kernels: Path | None = None):
    """(session, whether ORT records node placement, whether CPU fallback is disabled,
    what the session reads in place and must outlive it). ``kernels``: our custom-op
    library, checked against this CPU already."""
    options = ort.SessionOptions()
    if kernels is not None:
        register_kernels(options, kernels, partition.name, where)
    # never 0, ORT's default: that pool ignores the CPU mask and pins its threads
    options.intra_op_num_threads = intra_op_threads()
    weights = supply_shared(ort, options, shared_tensors, in_memory_files=bool(shared_files),
                            partition=partition.name, where=where) if shared_tensors else []
    # ORT refuses 'no CPU fallback' when the CPU provider is itself requested: the CPU
    # is then a chosen provider, not a fallback, so the setting has nothing to forbid.
    no_fallback = forbid and CPU not in usable
    if no_fallback:
        options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    records = hasattr(ort.InferenceSession, "get_provider_graph_assignment_info")
    if records:  # ORT >= 1.24-ish: per-node provider assignment, recorded on request
        options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    try:
        session = ort.InferenceSession(str(model), options, providers=usable)
    except Exception as exc:  # ORT raises its own pybind types (Fail, InvalidArgument, ...)
        raise _refused(exc, model, partition, where, no_fallback, usable) from exc

    return session, records, no_fallback, weights


def _refused(exc: Exception, model: Path, partition: Partition, where: str,
             no_fallback: bool, usable: list[str]) -> ArtifactError | CompatibilityError:
    """ORT's refusal of a verified partition file: the artifact is bad input (exit 2), or,
    with CPU fallback forbidden, this machine's providers cannot take every node."""
    lines = str(exc).strip().splitlines()
    # ORT quotes the private copy's path, gone by now; ``where`` names the entry
    said = (lines[0] if lines else "").replace(str(model), model.name)[:400]
    what = (f"ONNX Runtime could not load partition '{partition.name}' "
            f"({type(exc).__name__}: {said})")
    if no_fallback:
        return CompatibilityError(what, where=where, hint=(
            f"CPU fallback is forbidden and {', '.join(usable)} cannot run every node here; "
            "rebuild with fallback 'allow' or run where those providers are installed"))
    return ArtifactError(what, where=where, hint="the artifact's ONNX graph is broken or "
                         "was made for a newer onnxruntime (its version is in `exporter "
                         "inspect`); rebuild it with `exporter build`")


def _runner(ort, session, partition: Partition, where: str, arrays: bool,
            meta: OnnxRuntimeMeta) -> Callable[[list[Any]], list[Any]]:
    """Numpy arrays straight to ``run`` (``arrays``); torch tensors by IO binding over
    their memory where it applies (ort_binding.py), else ``run`` with numpy feeds.
    ``in_place`` outputs are bound onto their input's memory by the binding; the plain
    ``run`` asks ORT for them and copies each into its input, so after either path the
    cache input holds what the kernel wrote."""
    names = [i.name for i in session.get_inputs()]
    in_place = meta.in_place or {}
    output_names = [o.name for o in session.get_outputs() if o.name not in in_place]
    written = [(name, names.index(source)) for name, source in in_place.items()]
    asked = output_names + [name for name, _ in written]  # the plain run's: presents last
    returned = len(output_names)  # how many of ``asked`` the caller gets
    # The binding under InferenceSession.run: the wrapper re-validates the feed names
    # (our Program checked the inputs already) and, on an execution-provider failure,
    # silently re-runs on other providers, which this runtime must not do.
    session_run = getattr(getattr(session, "_sess", None), "run", None)
    if session_run is None:
        session_run = session.run
    # Made once: with None, each run builds default RunOptions.
    # Shared by threads: a run only reads them.
    options = ort.RunOptions()

    def check_count(inputs: list) -> None:
        # Positional: the exporter keeps the partition's inputs, in order, as graph inputs.
        if len(inputs) != len(names):
            raise ExecutionError(f"partition '{partition.name}' takes {len(names)} inputs, "
                                 f"got {len(inputs)}", where=where)

    if arrays:
        def run_arrays(inputs: list) -> list:
            check_count(inputs)
            values = session_run(asked, dict(zip(names, inputs)), options)
            for (_, index), value in zip(written, values[returned:]):
                inputs[index][...] = value
            return values[:returned]
        return _returning_stored_rows(run_arrays, meta, partition, names, written, where,
                                      lambda a, start, end: a[:, :, start:end])

    import torch
    from runtime.executors.ort_binding import bound_runner

    def run(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        check_count(inputs)
        try:  # the common case, plain CPU tensors, costs one call each
            feeds = dict(zip(names, map(torch.Tensor.numpy, inputs)))
        except (TypeError, RuntimeError):  # bfloat16, GPU, requires_grad: see why
            feeds = {name: _to_numpy(t, name, where) for name, t in zip(names, inputs)}
        values = list(map(torch.from_numpy, session_run(asked, feeds, options)))
        with torch.no_grad():
            for (_, index), value in zip(written, values[returned:]):
                inputs[index].copy_(value)
        return values[:returned]

    if getattr(session, "_sess", None) is None or not hasattr(session._sess, "run_with_iobinding"):
        runner = run
    else:
        runner = bound_runner(ort, session, options, fallback=run, in_place=dict(written))
    return _returning_stored_rows(runner, meta, partition, names, written, where,
                                  lambda t, start, end: t.narrow(2, start, end - start))


def _returning_stored_rows(run: Callable, meta: OnnxRuntimeMeta, partition: Partition,
                           names: list[str], written: list[tuple[str, int]], where: str,
                           rows: Callable) -> Callable:
    """``run`` with the partition's stored outputs put back in their places, each a view of
    the cache input the kernel wrote its rows into (OnnxRuntimeMeta.stored_outputs)."""
    outputs, into = meta.stored_outputs or (), meta.stored_into or ()
    if not outputs and not into:
        return run
    start_at = meta.rows_start
    kept_in_place = {index for _, index in written}  # only those hold the kernel's rows
    if len(outputs) != len(into) or list(outputs) != sorted(set(outputs)) \
            or start_at is None or start_at >= len(names) \
            or any(out >= len(partition.outputs) for out in outputs) \
            or not set(into) <= kept_in_place:
        raise ArtifactError(f"partition '{partition.name}' names stored outputs that do not "
                            "fit its inputs and outputs", where=where,
                            hint="rebuild the artifact with `exporter build`")
    stored = tuple(zip(outputs, into))

    def run_storing(inputs: list) -> list:
        values = run(inputs)
        positions = inputs[start_at]
        start = int(positions[0])
        end = start + positions.shape[0]
        for out, source in stored:  # ascending: each lands at its final index
            values.insert(out, rows(inputs[source], start, end))
        return values
    # Without the views, for a caller that reads the rows where they were stored
    # (Program.run_in_place): making them is a visible part of a decode step.
    run_storing.computing, run_storing.stored_outputs = run, tuple(outputs)
    return run_storing


def _to_numpy(tensor, name: str, where: str):
    if str(tensor.dtype) == "torch.bfloat16":  # numpy has no bfloat16
        raise ExecutionError(f"input '{name}' is bfloat16, which the ONNX Runtime executor "
                             "cannot pass through numpy", where=where,
                             hint="build with --dtype fp32 or fp16 for the onnx target")
    return tensor.detach().cpu().numpy()


def _placement(session) -> dict:
    """{provider: {"nodes": count, "op_types": {op_type: count}}} from ORT's own record."""
    result: dict[str, Counter] = {}
    for subgraph in session.get_provider_graph_assignment_info():
        counts = result.setdefault(subgraph.ep_name, Counter())
        counts.update(node.op_type for node in subgraph.get_nodes())
    return {ep: {"nodes": sum(c.values()), "op_types": dict(sorted(c.items()))}
            for ep, c in result.items()}


def _check_external_data(model: Path, where: str, ort_version: str) -> None:
    """Every external-data location must be a plain file name in the model's folder.

    Checked with `onnx` (protobuf parse without loading the data) before ORT opens
    anything; a hostile artifact could otherwise make ORT read '../../secret'."""
    try:
        import onnx
        from onnx.external_data_helper import ExternalDataInfo, uses_external_data
    except ImportError:
        version = tuple(int(p) for p in ort_version.split(".")[:2] if p.isdigit())
        if version < _ORT_CHECKS_PATHS:
            raise CompatibilityError(
                f"onnxruntime {ort_version} does not check external-data paths itself and "
                "`onnx` is not installed to check them", where=where,
                hint="pip install onnx, or onnxruntime>=1.24") from None
        log.info("onnx not installed: external-data paths left to onnxruntime's own check")
        return
    try:
        proto = onnx.load(str(model), load_external_data=False)
    except Exception as exc:  # protobuf's DecodeError and friends
        raise ArtifactError(f"the ONNX model cannot be parsed ({type(exc).__name__})",
                            where=where, hint="rebuild the artifact") from exc
    folder = model.parent.resolve()
    bad = sorted({info.location for t in _tensors(proto) if uses_external_data(t)
                  for info in [ExternalDataInfo(t)] if not _plain_name(info.location, folder)})
    if bad:
        raise ArtifactError(
            f"the ONNX model points {len(bad)} external-data location(s) outside its folder",
            where=where, details=bad,
            hint="do not load this artifact; external data must be a file next to the model")


def _plain_name(location: str, folder: Path) -> bool:
    if not location or location in (".", ".."):
        return False
    for flavour in (PurePosixPath(location), PureWindowsPath(location)):
        if flavour.is_absolute() or flavour.anchor or len(flavour.parts) != 1:
            return False
    # A symlink next to the model could still point elsewhere.
    return (folder / location).resolve().parent == folder


def _tensors(proto):
    """Every TensorProto that may carry external data: initializers, sparse parts and
    tensor attributes, in the main graph, subgraphs and model-local functions."""
    def graph(g):
        yield from g.initializer
        for sparse in g.sparse_initializer:
            yield sparse.values
            yield sparse.indices
        for n in g.node:
            yield from nodes_attr(n)

    def nodes_attr(n):
        for a in n.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
            if a.HasField("g"):
                yield from graph(a.g)
            for sub in a.graphs:
                yield from graph(sub)

    yield from graph(proto.graph)
    for function in proto.functions:
        for n in function.node:
            yield from nodes_attr(n)
