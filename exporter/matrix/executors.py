"""Where cells run: ``local`` (this machine, N cells at a time, each in its own process)
or ``ray`` (each cell a Ray task on a local or existing cluster).

Both call ``cell.run_job`` and hand each result to ``done(job, row)`` as it arrives, in
the calling thread. Results come back as return values (Ray: through its object store,
they are small); artifacts are written by the cell straight into the cache, which must
be a path every worker sees (on a multi-node cluster: a shared file system).
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import signal
import socket
import threading
from pathlib import Path
from typing import Callable

from exporter.errors import TargetUnavailableError, UserInputError
from exporter.matrix import warm
from exporter.matrix.cell import Job, run_job, stop_all
from runtime.host.hostinfo import usable_cores

Started = Callable[[Job], None]
Done = Callable[[Job, dict], None]
EXECUTORS = ("local", "ray")


def run_local(jobs: list[Job], workers: int, started: Started, done: Done) -> None:
    """A pool of ``workers`` threads, each waiting on one cell's processes (the cells
    are processes; a thread costs nothing while it waits)."""
    def one(job: Job) -> dict:
        started(job)
        return run_job(job)

    pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="cell")
    try:
        futures = {pool.submit(one, job): job for job in jobs}
        for future in concurrent.futures.as_completed(futures):
            done(futures[future], future.result())
    except BaseException:  # Ctrl-C: stop the builds in flight, start no others
        pool.shutdown(wait=False, cancel_futures=True)
        stop_all()
        raise
    finally:
        warm.close_all()
    pool.shutdown()


def connect_ray(workers: int | None, address: str | None):
    """The ray module, with a local cluster started or the one at ``address`` joined.
    Before the matrix writes anything: an address nobody answers at is exit 2 at once
    (Ray itself retries for minutes), and a cluster that cannot start is said plainly."""
    ray = _import_ray()
    if address:
        _check_reachable(address)
    # ray.init installs its own SIGINT/SIGTERM handlers; the CLI's (exit 130, the
    # builds stopped, the table so far written) must stay
    main = threading.current_thread() is threading.main_thread()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        _init(ray, workers, address)
    except Exception as exc:  # Ray raises ConnectionError, RuntimeError, its own types
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        doing = f"join the cluster at {address}" if address else "start a local cluster"
        raise TargetUnavailableError(
            f"Ray could not {doing}: {reason}",
            hint="a ray:// address needs pip install 'ray[client]'; check `ray status` on "
                 "the head node, or use --executor local") from None
    finally:
        if main:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
    return ray


def run_ray(ray, jobs: list[Job], workers: int | None, retries: int,
            started: Started, done: Done) -> None:
    """Each cell a Ray task asking one CPU (a GPU for cuda cells), retried up to
    ``retries`` times when its worker dies; at most ``workers`` in flight. ``ray``:
    what ``connect_ray`` returned; the cluster is let go at the end."""
    try:
        task = ray.remote(run_job)
        limit = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        todo, pending = list(jobs), {}
        while todo or pending:
            while todo and len(pending) < limit:
                job = todo.pop(0)
                gpus = 1 if job.device == "cuda" else 0
                ref = task.options(num_cpus=1, num_gpus=gpus,
                                   max_retries=retries, name=job.cell_id).remote(job)
                pending[ref] = job
                started(job)
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            for ref in ready:
                done(pending.pop(ref), _result(ray, ref, retries))
    except BaseException:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise
    finally:
        ray.shutdown()


def _result(ray, ref, retries: int) -> dict:
    try:
        return ray.get(ref)
    except ray.exceptions.RayError as exc:  # the worker died on every try, or Ray failed
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        return {"status": "crash", "exit_code": None, "attempts": retries + 1,
                "error": f"Ray: {type(exc).__name__} after {retries + 1} tries: {first}"}


def _init(ray, workers: int | None, address: str | None) -> None:
    """A local cluster of ``workers`` CPUs without a dashboard, or the cluster at
    ``address``. The cells' workers import the exporter this process runs."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])
    options = dict(include_dashboard=False, logging_level=logging.ERROR,
                   log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": path}})
    if address:
        ray.init(address=address, **options)
    else:
        ray.init(num_cpus=workers or usable_cores(), **options)


def _check_reachable(address: str) -> None:
    """``host:port`` or ``ray://host:port`` must take a TCP connection ("auto" and other
    words are Ray's to resolve)."""
    host, colon, port = address.removeprefix("ray://").rpartition(":")
    if not colon or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]") or "localhost", int(port)),
                                 timeout=5).close()
    except OSError as exc:
        raise UserInputError(f"nothing answers at --ray-address {address} "
                             f"({exc.strerror or exc})",
                             hint="start the cluster (ray start --head) or check the address "
                                  "and port; without --ray-address a local cluster starts "
                                  "here") from None


def _import_ray():
    try:
        import ray
    except ImportError:
        raise TargetUnavailableError(
            "--executor ray needs the ray package, which is not installed",
            hint="pip install 'edge-exporter[matrix]' (or pip install ray), or use "
                 "--executor local") from None
    return ray
