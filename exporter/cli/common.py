"""What every command shares: the app, one output style, error handling, JSON.

Output style (every command):
  - stdout carries the result: the table or figures asked for, the path of what was
    written, or with ``--json`` one JSON object (docs/json.md: keys are stable within a
    ``json_version``).
  - stderr carries everything else, one line each: progress, ``note: ...``,
    ``warning: ...`` and ``error: ...`` (what, where, ``Try:`` what to do).
  - ``--quiet`` keeps only errors and the result; ``--verbose`` adds debug logs of the
    exporter, its passes, targets and runtime (and stops hiding torch's own logs);
    ``--debug`` adds tracebacks to errors. Each works before the command
    (``exporter --quiet build``) or after it (``exporter build --quiet``).

Exit codes: 0 ok, 1 validation failed, 2 bad usage or input, 3 build failed,
4 a bug of the exporter's own (the paragraph names the stage and the log with the
traceback), 130 interrupted, 141 stdout's reader went away (`| head`; nothing said).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import signal
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

import typer
from rich.console import Console
from rich.markup import escape

from exporter.cli import interrupts

if TYPE_CHECKING:
    from runtime.errors import ToolchainError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="Export PyTorch models to validated, self-contained device artifacts.")


class _ReaderGone(Exception):
    """stdout's reader went away (`exporter inspect A | head`)."""


class _PipeAwareConsole(Console):
    def on_broken_pipe(self) -> None:  # rich's own raises SystemExit: "the model's sys.exit"
        raise _ReaderGone


def _console(stderr: bool) -> Console:
    """In a terminal rich wraps text at word boundaries to its width; into a pipe or a
    file it would hard-wrap at 80 columns mid-sentence, so there lines stay whole, and a
    table row stays one line at its natural width (`exporter targets | grep onnx` finds
    the whole row; nothing is cut with "…") unless COLUMNS asks for a width."""
    console = _PipeAwareConsole(stderr=stderr)
    console.soft_wrap = not console.is_terminal
    if not console.is_terminal and not os.environ.get("COLUMNS", "").isdigit():
        console.width = _PIPE_WIDTH
    return console


_PIPE_WIDTH = 1000  # wider than any row: tables take only the width their cells need


err_console = _console(stderr=True)
out_console = _console(stderr=False)

QUIET = typer.Option(False, "--quiet", "-q", help="print only errors and the result")
VERBOSE = typer.Option(False, "--verbose", "-v", help="debug logs of the exporter and its "
                       "backends")
DEBUG = typer.Option(False, "--debug", help="show tracebacks on errors")
JSON = typer.Option(False, "--json", help="print one JSON object (docs/json.md)")
PRELOAD = typer.Option([], "--preload", help="FILE.py or module defining custom ops the "
                       "artifact's CPU fallback calls (repeatable)")


@dataclass
class Style:
    quiet: bool = False
    verbose: bool = False
    debug: bool = False
    json: bool = False


_global = Style()  # flags given before the command
style = Style()  # the flags in force for this command


def _print_version(value: bool) -> None:
    if value:
        from exporter.cli import version_line
        print(version_line())
        raise typer.Exit()


@app.callback()
def _main(debug: bool = DEBUG, verbose: bool = VERBOSE, quiet: bool = QUIET,
          version: bool = typer.Option(False, "--version", is_eager=True,
                                       callback=_print_version,
                                       help="print the version and exit")) -> None:
    _global.debug, _global.verbose, _global.quiet = debug, verbose, quiet


def say(message: str) -> None:
    """Progress or information: stderr, not under --quiet or --json."""
    if not (style.quiet or style.json):
        err_console.print(message, markup=False, highlight=False, soft_wrap=True)


def warn(message: str) -> None:
    if not style.quiet:
        err_console.print("warning: " + message, markup=False, highlight=False, soft_wrap=True)


def result(message, *, markup: bool = False) -> None:
    """The command's result (text, or a rich table) on stdout."""
    out_console.print(message, markup=markup, highlight=False, soft_wrap=True)


def wrote(path, detail: str = "") -> None:
    """A command that writes a file reports its path (alone under --quiet)."""
    if style.quiet:
        print(path)
    else:
        result(f"wrote {path}" + (f" ({detail})" if detail else ""))


_json_out = None  # where print_json writes while a --json command runs (see below)


def print_json(data: dict) -> None:
    from exporter.versions import JSON_VERSION
    payload = {"json_version": JSON_VERSION, **data}
    out = _json_out or sys.stdout
    out.write(json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")
    out.flush()


@contextlib.contextmanager
def _stdout_kept_for_json() -> Iterator[None]:
    """Under --json, stdout carries one JSON object and nothing else: whatever user code,
    a compiler or a C extension prints meanwhile goes to stderr (sys.stdout is stderr,
    and file descriptor 1 is pointed at 2), and print_json writes to the real stdout."""
    global _json_out
    real = sys.stdout
    real.flush()
    try:
        fd = real.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (a test runner's buffer)
        fd = None
    saved = os.dup(fd) if fd is not None else None
    if fd is not None:
        os.dup2(2, fd)
    _json_out = os.fdopen(saved, "w", closefd=False) if saved is not None else real
    sys.stdout = sys.stderr
    try:
        yield
    finally:
        sys.stdout = real
        _json_out.flush()
        if saved is not None:
            sys.stderr.flush()
            os.dup2(saved, fd)
            os.close(saved)
        _json_out = None


def stage_printer():
    """A context manager per stage: a spinner with the time so far (a compile can take
    minutes: the clock shows it is alive), then "✓ name 1.2s" (nothing when quiet).
    Where stderr is no terminal (a log file, CI) only the "✓" lines."""
    @contextlib.contextmanager
    def stage(name: str) -> Iterator[None]:
        interrupts.checkpoint()
        if style.quiet or style.json:
            yield
            return
        start = time.perf_counter()
        if err_console.is_terminal:
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
            with Progress(SpinnerColumn(), TextColumn("{task.description}"),
                          TimeElapsedColumn(), console=err_console, transient=True) as bar:
                bar.add_task(f"{name}...", total=None)
                yield
        else:
            yield
        err_console.print(f"[green]✓[/green] {escape(name)} "
                          f"[dim]{time.perf_counter() - start:.1f}s[/dim]", highlight=False)
    return stage


def guarded(action: Callable[[], int | None], *, quiet: bool = False, verbose: bool = False,
            debug: bool = False, as_json: bool = False, uses_torch: bool = True) -> None:
    """Run a command body in this command's style; turn ToolchainErrors into one
    paragraph (and, with --json, an error object) and an exit code. ``uses_torch``:
    whether its work imports torch, whose logs are then quieted (a command that needs
    none, as inspect, starts without importing it)."""
    style.quiet, style.verbose = quiet or _global.quiet, verbose or _global.verbose
    style.debug, style.json = debug or _global.debug, as_json
    with interrupts.held():
        _configure_logging(uses_torch)
        with contextlib.suppress(ValueError):  # only the main thread may set handlers
            signal.signal(signal.SIGTERM, interrupts.terminated)
    try:
        with _stdout_kept_for_json() if as_json else contextlib.nullcontext():
            _guarded_body(action, as_json)
    finally:
        interrupts.settle()


def _guarded_body(action: Callable[[], int | None], as_json: bool) -> None:
    from runtime.errors import ToolchainError  # here: --help needs no runtime package
    try:
        code = _interruptions_as_such(action)
    except (_ReaderGone, BrokenPipeError):
        # Stop quietly, as `git log | head` does; stdout goes to /dev/null so Python's
        # last flush at exit finds nothing to complain about. 141: killed by SIGPIPE.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(READER_GONE_EXIT) from None
    except ToolchainError as exc:
        _print_error(str(exc), exc)
        if as_json:
            print_json({"error": error_json(exc), **getattr(exc, "json_extra", {})})
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        interrupts.disarm()
        err_console.print("interrupted: nothing was written (an artifact is replaced whole or "
                          "not at all; the next build removes this one's temporary files)")
        interrupts.told()
        raise typer.Exit(130) from None
    except OSError as exc:
        if exc.errno not in _DISK_ERRORS:
            _internal_error(exc, as_json)
        _print_error(f"cannot write {exc.filename or 'a file'}: {exc.strerror}. Nothing was "
                     "replaced.\nTry: free disk space, or choose another --out", exc)
        raise typer.Exit(2) from None
    except (typer.Exit, typer.Abort):
        raise
    except SystemExit as exc:  # not ours (we exit through typer.Exit): the model's code
        _print_error(f"the model's code, or a library it calls, called sys.exit({exc.code!r}) "
                     "during the command; nothing was written.\nTry: remove the sys.exit "
                     "call from the model's code path", exc)
        raise typer.Exit(3) from None
    except Exception as exc:  # noqa: BLE001 - anything untyped is a bug of ours
        _internal_error(exc, as_json)
    raise typer.Exit(code)


def _interruptions_as_such(action: Callable[[], int | None]) -> int:
    """The action's exit code; a KeyboardInterrupt (Ctrl-C, or SIGTERM by _terminated)
    that a library wrapped into an error of its own is raised as what it was. onnxruntime's
    pybind11 module, interrupted while it initialises, raises "ImportError: initialization
    failed" from it, which was reported as an internal error (exit 4)."""
    try:
        interrupts.checkpoint()  # a Ctrl-C between main()'s check and here, its raise
        # still waiting for an import to end (CI: the guard cancelled it, the build ran on)
        return action() or 0
    except Exception as exc:
        if interrupts.interrupted():  # raised, then swallowed (exporter/cli/interrupts.py)
            interrupts.disarm()
            raise KeyboardInterrupt from exc
        cause, seen = exc.__cause__ or exc.__context__, set()
        while cause is not None and id(cause) not in seen:  # a chain can loop
            if isinstance(cause, KeyboardInterrupt):
                raise KeyboardInterrupt from exc
            seen.add(id(cause))
            cause = cause.__cause__ or cause.__context__
        raise


INTERNAL_ERROR_EXIT = 4
READER_GONE_EXIT = 141  # what a shell reports for a process SIGPIPE stopped


def _internal_error(exc: BaseException, as_json: bool) -> None:
    """An exception the toolchain did not raise on purpose: not the user's mistake and not
    a validation failure. One paragraph naming the stage and the log file that holds the
    traceback (--debug prints it too); exit code 4."""
    import tempfile
    import traceback
    stage = getattr(exc, "exporter_stage", None) or "the command"
    log_path = Path(tempfile.gettempdir()) / f"exporter-internal-error-{os.getpid()}.log"
    log_path.write_text("".join(traceback.format_exception(exc)))
    # build flags help only where a build stage broke (the stage timer names it)
    detour = ("; --no-fuse or another --target may avoid the failing step"
              if getattr(exc, "exporter_stage", None) else "")
    message = (f"internal error in {stage}: {type(exc).__name__}: "
               f"{(str(exc).strip().splitlines() or [''])[0][:300]}. This is a bug in the "
               f"exporter, not in your model. Where: the traceback is in {log_path}.\n"
               f"Try: --debug to print it{detour}; please report it with that log")
    _print_error(message, exc)
    if as_json:
        print_json({"error": {"type": "InternalError", "exit_code": INTERNAL_ERROR_EXIT,
                              "message": message, "what": message.split(". Where")[0],
                              "where": str(log_path), "hint": None, "details": [],
                              "stage": stage, "exception": type(exc).__name__}})
    raise typer.Exit(INTERNAL_ERROR_EXIT) from None


# A full disk, a quota, a file-size limit or a read-only file system: the user's to fix.
_DISK_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}


def _print_error(message: str, exc: BaseException) -> None:
    if style.debug:
        err_console.print_exception()
    # markup off: messages quote user code, which may contain [brackets]
    err_console.print("error: " + message, highlight=False, markup=False, soft_wrap=True)


def error_json(exc: ToolchainError) -> dict:
    return {"type": type(exc).__name__, "exit_code": exc.exit_code, "message": str(exc),
            "what": exc.what, "where": exc.where, "hint": exc.hint, "details": exc.details,
            "stage": getattr(exc, "exporter_stage", None)}


class _OneStyleFormatter(logging.Formatter):
    """Log records in the CLI's style: "warning: ...", "error: ...", and with --verbose
    "debug exporter.builder.pipeline: ..." (the logger's name says which part spoke)."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info and style.debug:
            message += "\n" + self.formatException(record.exc_info)
        if record.levelno >= logging.WARNING:
            return f"{record.levelname.lower()}: {message}"
        return f"{record.levelname.lower()} {record.name}: {message}"


_OUR_LOGGERS = ("exporter", "passes", "targets", "runtime")


def _configure_logging(uses_torch: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OneStyleFormatter())
    logging.basicConfig(level=logging.ERROR if style.quiet else logging.WARNING,
                        handlers=[handler], force=True)
    logging.captureWarnings(True)  # Python warnings in the same style, silenced by --quiet
    for name in _OUR_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if style.verbose else logging.NOTSET)
    if uses_torch:
        quiet_torch_logs()


def quiet_torch_logs() -> None:
    """Torch's and the backends' chatter below errors (not under --verbose). A command
    that checks its input before its work imports torch (build) calls this after."""
    if style.verbose:
        return
    # torch 2.13 warns about its own use of a deprecated pytree class while it lowers;
    # nothing a user can act on.
    warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
    # torch.export logs graph dumps and guard warnings at WARNING; our own error paragraph
    # already says what matters, so keep the terminal readable.
    import torch._logging
    torch._logging.set_logs(all=logging.ERROR)
    from targets import described  # the cards: running an artifact loads no target
    for name in {n for card in described().values() for n in card.loggers_to_quiet}:
        logging.getLogger(name).setLevel(logging.ERROR)
    # Third-party noise that says nothing about the user's build (--verbose shows it):
    # torchao failing to load CUDA kernels on a CPU machine and finding no triton (it is
    # imported for --quantize whether asked or not), TF32 advice, pytree deprecations.
    logging.getLogger("torchao").setLevel(logging.ERROR)
    for message in (".*TF32.*", ".*_register_pytree_node.*", ".*torch.utils._pytree.*",
                    ".*Enum subclass.*"):
        warnings.filterwarnings("ignore", message=message)
