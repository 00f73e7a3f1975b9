"""The ``commscope`` command: one sub-command per module in ``commscope.commands``."""

from __future__ import annotations

import argparse
import gc
import importlib
import sys
import traceback

from commscope import __version__, errors, helpformat
from commscope.redact import redact
from commscope.visible import visible

#: verb -> (module, one-line help).  The verbs are a public contract (`commscope --help`, README.md).
COMMANDS: dict[str, tuple[str, str]] = {
    "attach": ("commscope.commands.attach", "live console on a running job's trace store"),
    "replay": ("commscope.commands.replay", "console on a finished trace or Flight Recorder dumps"),
    "demo": ("commscope.commands.demo", "run a demo workload on local ranks and watch it live"),
    "run": ("commscope.commands.run", "run any command with instrumentation switched on"),
    "check": ("commscope.commands.check", "headless diagnosis (exit 0 ok, 1 errors found, 2 bad input, 3 a bug)"),
    "report": ("commscope.commands.report", "summary tables per op, group and rank"),
    "export": ("commscope.commands.export", "export a trace as Chrome/Perfetto JSON"),
    "snapshot": ("commscope.commands.snapshot", "snapshot a running job that was never instrumented (py-spy)"),
    "copy": ("commscope.commands.copy", "copy a trace between stores"),
    "bench": ("commscope.commands.bench", "benchmark suites (ratios measured side by side)"),
}


UsageError = errors.UsageError  # where commands raise it from (commscope.errors)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="commscope",
        description="Monitoring and debugging console for torch.distributed.",
        epilog="Store: a directory (default $COMMSCOPE_STORE, then ./commscope-trace) or "
               "redis://[:password@]host:port/db.  Run 'commscope COMMAND --help' for details.",
    )
    parser.add_argument("--version", action="version", version=f"commscope {__version__}")
    # dest "verb": ``run`` has a positional called ``command`` (the command it runs)
    sub = parser.add_subparsers(dest="verb", metavar="COMMAND")
    verbs: dict[str, argparse.ArgumentParser] = {}
    for verb, (module, help_text) in COMMANDS.items():
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            continue
        p = sub.add_parser(verb, help=help_text, description=(mod.__doc__ or help_text).strip(),
                           formatter_class=helpformat.Formatter)
        mod.add_arguments(p)
        p.set_defaults(_main=mod.main)
        verbs[verb] = p
    parser.set_defaults(_verbs=verbs)
    return parser


def _refuse_lone_dashes(args: argparse.Namespace) -> None:
    """An option given ``--`` as its value (``--since=--``): argparse hands it an empty list,
    unconverted, and the command crashed on it (exit 3) or took its default (helper-187).
    Refused as a usage error, exit 2."""
    sub = getattr(args, "_verbs", {}).get(getattr(args, "verb", None))
    for a in sub._actions if sub is not None else ():
        if a.option_strings and a.nargs is None and getattr(args, a.dest, None) == [] and a.default != []:
            sub.error(f"argument {'/'.join(a.option_strings)}: expected a value, not '--'")


def _internal(verb: str, argv: list[str] | None) -> int:
    """An exception no command expected: as a program (``argv`` None), its traceback and
    ``errors.INTERNAL``, so a CI step does not read a crash of ``check`` as "errors found"
    (Python's own exit status, 1); called in a process that goes on (a test), raised."""
    if argv is not None:
        raise  # noqa: PLE0704 (the exception being handled)
    print(redact(traceback.format_exc()), end="", file=sys.stderr)  # (an exception's text may hold a URL's password)
    print(f"commscope {verb}: internal error: this is a bug in commscope (exit {errors.INTERNAL}); "
          "the traceback above says where", file=sys.stderr)
    return errors.INTERNAL


def _negative_values(argv: list[str]) -> list[str]:
    """``--since -5m`` as ``--since=-5m``: argparse takes a value that starts with a dash and
    a digit for an option, and said "expected one argument" where the option's own words say
    what is wrong with the value (helper-204).  Not past ``--`` (the command ``run`` runs)."""
    out: list[str] = []
    for k, a in enumerate(argv):
        if a == "--":
            return out + argv[k:]
        if out and out[-1].startswith("--") and "=" not in out[-1] and len(a) > 1 and a[0] == "-" and a[1].isdigit():
            out[-1] = f"{out[-1]}={a}"
        else:
            out.append(a)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(_negative_values(sys.argv[1:] if argv is None else list(argv)))
    _refuse_lone_dashes(args)
    if not getattr(args, "_main", None):
        parser.print_help()
        return 2
    try:
        return int(args._main(args) or 0)
    except UsageError as exc:
        # (a name in it may come from a directory others write: its control characters are
        # shown, not sent to the terminal; and a credential in it is hidden, like every other)
        print(f"commscope {args.verb}: error: {visible(redact(str(exc)))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except OSError as exc:
        if isinstance(exc, BrokenPipeError) and errors.stdout_closed():
            return errors.closed_pipe()  # (the output's reader went away: no traceback, as ``git log | head``)
        # the machine's, not a bug: a full disk under standard output, an I/O error, another
        # pipe or socket broken (a Redis connection)
        if argv is not None:
            raise
        print(f"commscope {args.verb}: error: {visible(redact(str(exc)))}", file=sys.stderr)
        return 2
    except Exception:
        return _internal(args.verb, argv)
    finally:
        if argv is not None and gc.get_freeze_count():
            # Called in a process that goes on (argv given: a test, a tool): a command's load
            # froze what was alive (``load_trace(freeze=True)``); give it back to the collector.
            # The program itself (argv None) exits next and keeps it frozen: the collection
            # at exit would walk all of it.
            gc.unfreeze()


if __name__ == "__main__":
    sys.exit(main())
