"""Where a build's time goes, by sampling its main thread: runs a bench script in this
process with a thread that records the main thread's stack every INTERVAL seconds.

    python bench/compile_profile.py --out FILE [--interval 0.25] SCRIPT [ARGS...]

Each sample is one line of FILE, ``seconds<TAB>frame;frame;...`` (outermost first, each
``file:function``, an autotuner's with ``[kernel]``), written at once, so a run killed by
its time limit keeps what it sampled. ``--summary FILE`` prints the innermost frames by
share of samples, per window of seconds. INFO logging is on (the build's stage times);
``--debug-log LOGGER`` sets one logger to DEBUG. A sampler, not cProfile: the build runs
at its own speed.
"""

from __future__ import annotations

import argparse
import logging
import runpy
import sys
import threading
import time
from collections import Counter
from pathlib import Path


def _frames(frame) -> list[str]:
    """``file:function``, and ``[kernel]`` after a frame of an Inductor autotuner's method
    (its kernel's name: which kernel is being tuned)."""
    names = []
    while frame is not None:
        code = frame.f_code
        name = f"{Path(code.co_filename).name}:{code.co_name}"
        meta = _inductor_meta(frame.f_locals.get("self"))
        if isinstance(meta, dict) and meta.get("kernel_name"):
            name += f"[{meta['kernel_name']}]"
        names.append(name)
        frame = frame.f_back
    return names[::-1]


def _inductor_meta(owner) -> object:
    """``owner.inductor_meta``, or None: a frame's ``self`` may be any object, and some
    raise other errors than AttributeError from getattr (a Triton tensor: ValueError)."""
    try:
        return getattr(owner, "inductor_meta", None)
    except Exception:  # noqa: BLE001 (a sampler must not die on what it samples)
        return None


def sample(out: Path, interval: float, main_id: int, start: float) -> None:
    with open(out, "w", buffering=1) as fh:
        while True:
            time.sleep(interval)
            frame = sys._current_frames().get(main_id)
            if frame is not None:
                fh.write(f"{time.perf_counter() - start:.2f}\t{';'.join(_frames(frame))}\n")


def summary(path: Path, window: float) -> None:
    """The innermost frames worth naming (ours, torch's, triton's; a wait shows as the
    frame that waits) and the kernel being tuned, by share of each window's samples."""
    windows: dict[int, Counter] = {}
    for line in path.read_text().splitlines():
        at, _, stack = line.partition("\t")
        frames = stack.split(";")
        # the innermost two frames that are not the standard library's plumbing
        inner = [f for f in frames if not f.startswith(("threading.py", "selectors.py",
                                                        "_base.py", "thread.py"))][-2:]
        tuned = next((f[f.index("["):] for f in reversed(frames) if f.endswith("]")), "")
        label = " < ".join(inner[::-1]) + (f" {tuned}" if tuned else "")
        windows.setdefault(int(float(at) // window), Counter())[label] += 1
    for index in sorted(windows):
        counts = windows[index]
        total = sum(counts.values())
        print(f"## {index * window:.0f}-{(index + 1) * window:.0f} s ({total} samples)")
        for name, n in counts.most_common(6):
            print(f"  {n / total:5.0%}  {name[:160]}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path)
    parser.add_argument("--interval", type=float, default=0.25)
    parser.add_argument("--summary", type=Path)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--debug-log", action="append", default=[], metavar="LOGGER",
                        help="that logger at DEBUG (torch._inductor.runtime."
                             "coordinate_descent_tuner: each kernel tuned and its configs)")
    parser.add_argument("script", nargs="?")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    if args.summary:
        return summary(args.summary, args.window)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for name in args.debug_log:
        logging.getLogger(name).setLevel(logging.DEBUG)
    threading.Thread(target=sample, args=(args.out, args.interval, threading.get_ident(),
                                          time.perf_counter()), daemon=True).start()
    sys.argv = [args.script, *args.args]
    runpy.run_path(args.script, run_name="__main__")


if __name__ == "__main__":
    main()
