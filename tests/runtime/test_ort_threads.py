"""The ONNX Runtime executor's intra-op pool (runtime/executors/ort_threads.py): sized by
the CPUs this process may use, never ORT's default, which counts the machine's cores and
pins a thread to each, outside a ``taskset`` mask too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from runtime.executors.ort_threads import intra_op_threads, physical_cores
from tests.conftest import ROOT

pytest.importorskip("onnxruntime")

# A session of the executor on a one-node model, then every thread's allowed CPUs.
_CHILD = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path
    import onnx
    from onnx import TensorProto, helper
    from runtime.executors import create_executor
    from runtime.format.manifest import Partition

    folder = Path(sys.argv[1])
    (folder / "p0").mkdir()
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)],
                                ir_version=10), str(folder / "p0" / "model.onnx"))
    partition = Partition(name="p0", backend="onnxruntime", device="cpu",
                          files=("p0/model.onnx",), inputs=("x",), outputs=("y",),
                          meta={"model": "p0/model.onnx"})
    executor = create_executor(partition, folder, where="test")
    allowed = []
    for task in Path("/proc/self/task").iterdir():
        status = (task / "status").read_text().splitlines()
        line = next(l for l in status if l.startswith("Cpus_allowed_list"))
        allowed.append(line.split()[1])
    print(json.dumps({"threads": executor.report()["intra_op_threads"],
                      "allowed": allowed}))
""")


def _cpus_listed(text: str) -> set[int]:
    cpus: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux and two CPUs to restrict the process to one")
def test_a_session_under_a_one_cpu_mask_keeps_every_thread_inside_it(tmp_path):
    one = min(os.sched_getaffinity(0))
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path)], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=120,
        preexec_fn=lambda: os.sched_setaffinity(0, {one}))
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert all(_cpus_listed(allowed) <= {one} for allowed in seen["allowed"])
    assert seen["threads"] == 1


def test_omp_num_threads_sets_the_pool_as_it_does_torchs():
    assert intra_op_threads({"OMP_NUM_THREADS": "3"}) == 3
    assert intra_op_threads({"OMP_NUM_THREADS": "4,2"}) == 4  # nesting levels: the outer


@pytest.mark.parametrize("garbage", ["0", "-2", "two", ""])
def test_a_thread_count_that_is_not_one_falls_back_to_the_cpu_mask(garbage):
    assert intra_op_threads({"OMP_NUM_THREADS": garbage}) == intra_op_threads({}) >= 1


def test_hyperthread_siblings_count_as_one_core(tmp_path):
    # cpus 0 and 2 are one core's two threads, 1 and 3 another's
    for cpu, core in ((0, 0), (1, 1), (2, 0), (3, 1)):
        topology = tmp_path / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "physical_package_id").write_text("0\n")
        (topology / "core_id").write_text(f"{core}\n")
    assert physical_cores([0, 1, 2, 3], tmp_path) == 2
    assert physical_cores([0, 2], tmp_path) == 1


def test_without_a_topology_to_read_each_cpu_counts(tmp_path):
    assert physical_cores([0, 1, 5], tmp_path) == 3
