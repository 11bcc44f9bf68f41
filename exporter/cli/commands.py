"""The command list, and the group that imports a command's module only when it runs.

``exporter --help`` lists every command from ``COMMANDS`` alone: the modules stay
unimported, since ``build``'s flags are generated from the settings, every target's
options and pydantic, which cost more than the rest of the start together. A command
named on the command line (to run, or for its own ``--help``) imports its module then.
``tests/exporter/cli/test_startup.py`` checks the list against the commands themselves.
"""

from __future__ import annotations

import importlib
from difflib import get_close_matches

from typer import _click
from typer.core import TyperCommand, TyperGroup

# name -> (its module, its line in `exporter --help`), in the order the list shows them
COMMANDS: dict[str, tuple[str, str]] = {
    "build": ("exporter.cli.build", "Capture, lower, package and validate a model into one "
              "artifact file."),
    "run": ("exporter.cli.artifact", "Run an artifact on inputs from an .npz file."),
    "validate": ("exporter.cli.artifact", "Check an existing artifact against eager PyTorch "
                 "(exit 1 on mismatch); a generating artifact against transformers' "
                 "generate, by the gate its build used."),
    "bench": ("exporter.cli.artifact", "Time the artifact against eager (and torch.compile "
              "with --compile), in one process (a generating artifact: time to first token "
              "and tokens/s against transformers)."),
    "inspect": ("exporter.cli.artifact", "Verify an artifact's hashes and summarise its "
                "manifest (and, with --trusted-key, its signature)."),
    "report": ("exporter.cli.artifact", "Write one self-contained HTML page about an artifact "
               "(placement, errors, latency, FLOPs, graphs...), or comparing several builds "
               "of one model."),
    "sign": ("exporter.cli.artifact", "Sign an artifact's manifest (which pins every entry's "
             "hash) with an Ed25519 key."),
    "package": ("exporter.cli.artifact", "Bundle artifacts with a runtime wheel, a version lock "
                "and run scripts for a device."),
    "generate": ("exporter.cli.generate", "Generate text: prefill the prompt, then decode token "
                 "by token (streamed). An encoder-decoder (Whisper, BART, T5, ...) encodes "
                 "--source first; --prompt is then its decoder's (by default the decoder "
                 "start token)."),
    "doctor": ("exporter.cli.machine", "What this machine can build and run, and the fix for "
               "each problem."),
    "targets": ("exporter.cli.machine", "List targets and whether each can build and run on "
                "this machine."),
    "keygen": ("exporter.cli.machine", "Make an Ed25519 key pair for 'exporter sign'."),
    "matrix": ("exporter.cli.matrix", "Build, validate and bench models x targets; one table "
               "(json, csv, html) of the cells."),
}


class LazyGroup(TyperGroup):
    """The ``exporter`` group: a command's module is imported when the command is
    resolved; the list in ``--help`` is made of ``COMMANDS``' summaries. (A test that
    embeds ``app`` gets typer's own group, every module imported.)"""

    _listing = False

    def list_commands(self, ctx) -> list[str]:
        return list(COMMANDS) + [name for name in self.commands if name not in COMMANDS]

    def get_command(self, ctx, cmd_name: str):
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            if self._listing:  # only its line in the list is needed
                summary = COMMANDS[cmd_name][1]
                return TyperCommand(cmd_name, help=summary, short_help=summary)
            self.commands[cmd_name] = _load(cmd_name)
        return self.commands.get(cmd_name)

    def format_help(self, ctx, formatter) -> None:
        """The list in click's plain layout (uv's and ruff's): typer's boxed one imports
        rich's markdown and traceback modules, most of the start-up of `exporter --help`."""
        self._listing, markup = True, self.rich_markup_mode
        self.rich_markup_mode = None
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing, self.rich_markup_mode = False, markup

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        """`exporter` alone: the list, exit 2 (typer shows it only through rich)."""
        if not args and self.no_args_is_help and not ctx.resilient_parsing:
            _click.echo(ctx.get_help())
            ctx.exit(2)
        return super().parse_args(ctx, args)

    def resolve_command(self, ctx, args: list[str]):
        """typer's did-you-mean asks the commands loaded so far; this asks the list."""
        try:
            return self._click_resolve_command(ctx, args)
        except _click.exceptions.UsageError as error:
            matches = get_close_matches(args[0], self.list_commands(ctx)) if args else []
            if matches:
                error.message = (error.message.rstrip(".") + ". Did you mean "
                                 + ", ".join(repr(m) for m in matches) + "?")
            raise


def _load(name: str):
    """``name``'s click command, built by typer from its module's registration."""
    import typer.main

    from exporter.cli.common import app
    importlib.import_module(COMMANDS[name][0])
    info = next(i for i in app.registered_commands
                if (i.name or typer.main.get_command_name(i.callback.__name__)) == name)
    command = typer.main.get_command_from_info(
        info, pretty_exceptions_short=app.pretty_exceptions_short,
        rich_markup_mode=app.rich_markup_mode)
    tidy_help(command)
    return command


def console_command(args: list[str]) -> LazyGroup:
    """The ``exporter`` group as the console script runs it, its help tidied, with the
    module of the command ``args`` name imported (where the script still catches a Ctrl-C
    as 'nothing was written', before any command starts)."""
    import typer.main
    from typer.models import TyperInfo

    from exporter.cli.common import app
    group = typer.main.get_group_from_info(
        TyperInfo(app, cls=LazyGroup), pretty_exceptions_short=app.pretty_exceptions_short,
        rich_markup_mode=app.rich_markup_mode, suggest_commands=app.suggest_commands)
    tidy_help(group)
    _preload(group, args)
    return group


def _preload(group: LazyGroup, args: list[str]) -> None:
    """Resolve the command ``args`` names: its first word, when it is one."""
    name = next((arg for arg in args if not arg.startswith("-")), None)
    if name in COMMANDS:
        group.get_command(None, name)


def tidy_help(command) -> None:
    """Help that reads like uv's or ruff's: a flag (--help too) shows no ``<bool>`` type,
    an argument reads ``ARTIFACT`` in the usage line, not ``{ARTIFACT}``."""
    for sub in getattr(command, "commands", {}).values():
        tidy_help(sub)
    if not command.short_help and command.help:  # the command list: one summary, not the
        # docstring's line breaks (rich keeps them, breaking lines mid-sentence)
        command.short_help = " ".join(command.help.split("\n\n")[0].split()).replace("`", "'")
    make_help_option = command.get_help_option  # click adds --help itself, at parse time

    def help_option(ctx, make=make_help_option):
        option = make(ctx)
        if option is not None:
            option.metavar = ""
        return option
    command.get_help_option = help_option
    for param in command.params:  # typer's own (vendored) click classes: asked by kind
        if getattr(param, "help", None):  # rich prints `code` with its backticks
            param.help = param.help.replace("`", "'")
        if param.param_type_name == "option" and param.is_flag:
            param.metavar = ""
        elif param.param_type_name == "option" and param.multiple and param.metavar is None:
            param.metavar = "TEXT"  # repeatable; typer would print <list[str]>
        elif param.param_type_name == "argument":
            if param.metavar is None:
                param.metavar = param.name.upper()
            if param.required:  # typer writes a required argument as {NAME}; click, uv and
                # ruff write NAME (and [NAME] when optional, which typer keeps)
                param.get_usage_pieces = lambda ctx, name=param.metavar: [name]
