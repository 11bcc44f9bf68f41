"""One traced run of a ``.pte`` in a child process, for bisect (targets/executorch/inside.py):
ExecuTorch's event tracer aborts its process when the debug buffer runs out, or on any
failed check, and that process must not be the build's.

    python -m targets.executorch.traced_run FOLDER DEBUG_BUFFER_BYTES

reads FOLDER/program.pte and FOLDER/inputs.pt, writes FOLDER/run.etdp and FOLDER/debug.bin.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

TIMEOUT_S = 600
METHOD = "forward"


class TracedRunError(RuntimeError):
    """The child did not finish (bisect then stops at the partition, and says why)."""


def traced_run(buffer: bytes, inputs: list[torch.Tensor], debug_bytes: int,
               folder: Path) -> tuple[bytes, bytes]:
    """(ETDump, debug buffer) of one run of the program ``buffer`` on ``inputs``."""
    (folder / "program.pte").write_bytes(buffer)
    torch.save([t.detach().cpu().contiguous() for t in inputs], folder / "inputs.pt")
    try:
        done = subprocess.run([sys.executable, "-m", __spec__.name, str(folder),
                               str(debug_bytes)], capture_output=True, text=True,
                              timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise TracedRunError(f"ExecuTorch's traced run took over {TIMEOUT_S} s") from exc
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1][:300]
        raise TracedRunError(f"ExecuTorch's traced run exited with {done.returncode}: {last}")
    return (folder / "run.etdp").read_bytes(), (folder / "debug.bin").read_bytes()


def _main(folder: Path, debug_bytes: int) -> None:
    import executorch.kernels.quantized  # noqa: F401 - q/dq kernels a program may call
    from runtime.executors.executorch_pybind import load_program

    program = load_program((folder / "program.pte").read_bytes(), enable_etdump=True,
                           debug_buffer_size=debug_bytes)
    program.load_method(METHOD).execute(torch.load(folder / "inputs.pt", weights_only=True))
    program.write_etdump_result_to_file(str(folder / "run.etdp"), str(folder / "debug.bin"))


if __name__ == "__main__":
    _main(Path(sys.argv[1]), int(sys.argv[2]))
