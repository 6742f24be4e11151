"""``python -m tqstore`` (also the ``tqstore`` console script): look after stores,
checkpoints, generation roots and selective dumps from the shell, and run the demo.

Commands (each takes ``--json`` for a machine-readable report on stdout):

* ``demo``              — an RL loop with partial rollout, killed with SIGKILL and resumed;
* ``inspect PATH``      — what a store, a checkpoint, a generation root or a dump holds;
* ``verify PATH``       — check one of them, every byte against its CRC32C;
* ``ls PATH``           — a root's generations (step, size, time, valid), a checkpoint's files,
  a store's partitions, a dump's keys;
* ``prune ROOT --keep N`` — delete the generations older than the newest N that verify;
* ``compact STORE``     — rewrite mostly-dead segments of a store and merge small ones.

Exit status: 0 clean, 1 damaged or unreadable, 2 usage (bad arguments, or a path that is
not what the command works on), 141 the reader of the output went away.  Errors are one line on stderr, never a traceback.  A
progress bar is drawn on stderr for long checks only when it is a terminal (tqdm when
installed: the ``progress`` extra).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
from typing import Callable, Dict, Optional, Sequence, TextIO

from ._version import __version__
from .cli_util import EXIT_BROKEN_PIPE, EXIT_DAMAGED, EXIT_OK, EXIT_USAGE, CliDamaged, CliUsage
from .errors import CorruptionError, TqstoreError

__all__ = ["main", "build_parser", "EXIT_OK", "EXIT_DAMAGED", "EXIT_USAGE"]

_EXIT = ("Exit status: 0 clean, 1 damaged or unreadable, 2 usage or PATH is not a {what}, 141 the reader of the "
         "output went away (| head).")


def _add(sub, name: str, help_: str, description: str, example: str, what: str = "kind this command takes",
         exit_status: str = ""):
    return sub.add_parser(name, help=help_, description=description,
                          epilog=f"example:\n  {example}\n\n" + (exit_status or _EXIT.format(what=what)),
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def _path(text: str) -> str:
    """A command's PATH argument: any non-empty text ("" would name the current directory)."""
    if not text:
        raise argparse.ArgumentTypeError("the path is empty")
    return text


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m tqstore`` (one subparser per command)."""
    p = argparse.ArgumentParser(
        prog="python -m tqstore", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Look after tqstore stores, checkpoints, checkpoint generation roots and selective dumps; "
                    "run the demo. `python -m tqstore COMMAND --help` explains each command with an example.",
        epilog="examples:\n"
               "  python -m tqstore demo --steps 12\n"
               "  python -m tqstore ls run/generations\n"
               "  python -m tqstore verify run/generations --json\n"
               "  python -m tqstore prune run/generations --keep 3\n\n"
               "Exit status: 0 clean, 1 damaged or unreadable, 2 usage error, 141 the reader of the output went "
               "away (| head). Errors are one line on stderr; with --json a failing command also writes "
               "{\"ok\": false, \"exit\": N, \"error\": ...} on stdout.")
    p.add_argument("--version", action="version", version=f"tqstore {__version__}")
    sub = p.add_subparsers(dest="command", metavar="{demo,inspect,verify,ls,prune,compact}")

    d = _add(sub, "demo", "an RL loop with partial rollout, killed with SIGKILL and resumed",
             "Run a small RL post-training loop on an embedded store in a child process: producer threads put "
             "GRPO groups of samples (token ids, logprobs, text, a status tag), finishing partial rollouts in a "
             "later step; the trainer consumes whole groups; a CheckpointManager saves a generation every "
             "--save-every steps: in pending mode (the default) the trainer's side of the buffer, and the pending "
             "samples are dumped by key beside it with blocking=False; in full mode the whole buffer, with "
             "blocking=False. The demo kills the child with SIGKILL during a random step once a generation is "
             "published (the child waits for the demo's go after each step), restarts it, "
             "restores the newest valid generation, and finishes. It prints one line per step and a summary, "
             "and checks that every acknowledged sample came back and none was consumed twice (exit 1 if not).",
             "python -m tqstore demo --steps 12 --rows 64 --seed 1 --dir /tmp/tq-demo",
             exit_status="Exit status: 0 every acknowledged sample came back and none was consumed twice, 1 not, "
                         "2 usage error.")
    d.add_argument("--steps", type=int, default=12, help="trainer steps (default 12)")
    d.add_argument("--rows", type=int, default=64, help="samples consumed per step (a multiple of --group; "
                                                          "default 64)")
    d.add_argument("--group", type=int, default=4, help="samples per prompt, a GRPO group (default 4)")
    d.add_argument("--save-every", type=int, default=3, help="save a generation every K steps (default 3)")
    d.add_argument("--tokens", type=int, default=2048, help="mean response length in tokens (default 2048)")
    d.add_argument("--dir", help="work in this directory and keep it (default: a temporary one, removed)")
    d.add_argument("--seed", type=int, default=None, help="seed of the samples and of the kill step "
                                                            "(default: random)")
    d.add_argument("--no-kill", action="store_true", help="run to the end without killing the loop")
    d.add_argument("--mode", choices=("pending", "full"), default=None,
                   help="pending: generations hold the trainer's side of the buffer (include_storage=False) and the "
                        "pending samples are dumped by key beside each (the default when this build has "
                        "dump_data_by_key and load_data_by_key); full: generations hold the whole buffer")
    d.add_argument("--json", action="store_true", help="print the summary as JSON on stdout (step lines on stderr)")

    i = _add(sub, "inspect", "summarise a store, a checkpoint, a generation root or a dump",
             "Summarise what PATH holds: a checkpoint (format version, rows, partitions, units, frames, bytes, "
             "metadata), a CheckpointManager root (each generation: step, rows, units, size, format version, "
             "time), a store directory (units, segments, rows per partition, bytes) or a selective dump (its "
             "describe_dump report). Reads only and verifies nothing beyond parsing (use verify); a "
             "generation whose manifest does not parse is listed as unreadable and makes the exit status 1.",
             "python -m tqstore inspect run/generations/step-0000000100", "store, checkpoint, root or dump")
    i.add_argument("path", type=_path, help="a store, a checkpoint, a CheckpointManager root, a dump or a directory of dumps")
    i.add_argument("--json", action="store_true", help="print a JSON document on stdout")

    v = _add(sub, "verify", "check a store, a checkpoint, every generation of a root, or a dump",
             "Check PATH (checkpoints, roots and dumps are only read; their lock files are created when missing; "
             "while a save, dump, load or prune of PATH holds its lock, waits for it, saying so on stderr). "
             "A checkpoint: its manifest and checksum, every listed "
             "file's presence, size and CRC32C, every segment's header, no unlisted files and (unless --quick) "
             "the indexes and every indexed frame against its CRC32C. A generation root: every generation (one "
             "without MANIFEST.json counts as damaged; a root not saved to yet has nothing to verify: exit 0). "
             "A store: walks its index files in a child process (a damaged LMDB page is "
             "reported, not fatal) and looks for files its open would take for lost (a missing unit directory "
             "or segment file, a truncated segment: reported, nothing changed, unless --repair); then opens it "
             "(it must not be open elsewhere; its crash recovery runs as at any open, and with --repair what it "
             "dropped is reported, by that run only), checks every stored frame and decodes the controller's "
             "index. A dump: every shard "
             "frame; a directory of dumps (one per step, as the demo writes them): each dump. One line per "
             "problem, naming file and offset (and a store's damaged frame by its partition, key or row, and "
             "field).", "python -m tqstore verify run/generations", "store, checkpoint, root or dump")
    v.add_argument("path", type=_path, help="a store, a checkpoint, a CheckpointManager root, a dump or a directory of dumps")
    v.add_argument("--json", action="store_true", help="print a JSON report on stdout")
    v.add_argument("--quick", action="store_true", help="checkpoints: the manifest and each file's size and "
                                                        "CRC32C only (not the indexes or frames)")
    v.add_argument("--repair", action="store_true", help="stores: open the store even when its open drops data "
                                                         "as lost (missing or truncated files): the loss is "
                                                         "accepted for good, and reported")

    ls = _add(sub, "ls", "list a root's generations, a checkpoint's files, a store's partitions or a dump's keys",
              "List the generations under a CheckpointManager root (step, size, time written, valid: each is "
              "verified, --quick by default, --deep for every frame; exit 1 when one is not valid), the files of "
              "a checkpoint as MANIFEST.json records them (size, CRC32C, role, path), the partitions of a store "
              "(rows, keys; read only) or the keys of a dump (fields, tag); a key or partition id holding a "
              "character that is not printable, or starting with a double quote, is shown as a JSON string.",
              "python -m tqstore ls run/generations --deep", "store, checkpoint, root or dump")
    ls.add_argument("path", type=_path, help="a CheckpointManager root, a checkpoint, a store, a dump or a directory of dumps")
    ls.add_argument("--json", action="store_true", help="print JSON on stdout")
    ls.add_argument("--deep", action="store_true", help="roots: check every frame of every generation (slower)")

    pr = _add(sub, "prune", "delete old generations of a root, keeping the newest N that verify",
              "Delete the generations under a CheckpointManager root older than the newest --keep N that "
              "verify. The generations are verified from the newest down first (deep unless --quick) until N "
              "verify; newer ones that do not verify are kept too (and named: they hold no slot of the N, so a "
              "damaged generation never costs an older good one), and torn ones (no MANIFEST.json) older than "
              "every generation kept are deleted. When none verifies nothing is deleted (exit 1). A generation "
              "directory holding what is not a tqstore checkpoint is left alone and named. --dry-run says what "
              "the same run would delete. Runs under the root's exclusive lock, as CheckpointManager.prune.",
              "python -m tqstore prune run/generations --keep 2 --dry-run", "generation root")
    pr.add_argument("path", type=_path, help="a CheckpointManager root")
    pr.add_argument("--keep", type=int, required=True, help="how many of the newest valid generations to keep (>= 1)")
    pr.add_argument("--dry-run", action="store_true", help="say what would be deleted, delete nothing")
    pr.add_argument("--quick", action="store_true", help="find the newest valid generations with quick checks")
    pr.add_argument("--json", action="store_true", help="print a JSON report on stdout")

    c = _add(sub, "compact", "rewrite the mostly-dead segments of a store and merge small ones",
             "Open the store (it must not be open in another process; one whose open would drop data as lost, "
             "a missing unit directory or segment file or a truncated segment, is refused, nothing changed: "
             "exit 1) and rewrite the live frames of sealed "
             "segments whose live bytes are below --live-ratio of their size, and of small segments (less live "
             "data than 1/16 of the segment size) when a unit has two or more, then unlink those segments. "
             "Acknowledged data is kept; segments a checkpoint hard-linked stay valid in the checkpoint.",
             "python -m tqstore compact run/buffer --live-ratio 0.5", "store directory")
    c.add_argument("path", type=_path, help="a store directory")
    c.add_argument("--live-ratio", type=float, default=0.5, help="compact segments less live than this, in (0, 1] (default 0.5)")
    c.add_argument("--json", action="store_true", help="print a JSON report on stdout")

    return p


def _commands() -> Dict[str, Callable[..., int]]:
    from .cli_admin import cmd_compact, cmd_prune
    from .cli_demo import cmd_demo
    from .cli_inspect import cmd_inspect, cmd_ls, cmd_verify

    return {"verify": cmd_verify, "inspect": cmd_inspect, "ls": cmd_ls, "prune": cmd_prune, "compact": cmd_compact,
            "demo": cmd_demo}


def main(argv: Optional[Sequence[str]] = None, *, out: Optional[TextIO] = None, err: Optional[TextIO] = None) -> int:
    """Run one command; returns its exit status (0 clean, 1 damaged, 2 usage)."""
    out = out or sys.stdout
    err = err or sys.stderr
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) == 2 and argv[0] == "_demo-loop":  # the demo's child process (not a command of the help)
        from .cli_demo import cmd_demo_loop

        return cmd_demo_loop(argparse.Namespace(config=argv[1]), out, err)
    parser = build_parser()
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(out):
            args = parser.parse_args(argv)
    except SystemExit as e:  # argparse printed the usage line and its error (or --help / --version)
        err.write(said.getvalue())
        code = int(e.code or 0) and EXIT_USAGE
        if code and "--json" in argv:  # (a usage error answers in JSON on stdout too)
            from .cli_util import to_json

            lines = [line.split("error: ", 1)[1] for line in said.getvalue().splitlines() if "error: " in line]
            out.write(to_json({"ok": False, "exit": code, "error": lines[-1] if lines else "usage error"}) + "\n")
        return code
    err.write(said.getvalue())
    if not args.command:
        parser.print_help(out)
        return EXIT_USAGE
    if not getattr(args, "json", False):
        return _run(args, out, err)
    seen_out, seen_err = _Seen(out), _Seen(err)
    code = _run(args, seen_out, seen_err)
    if code not in (EXIT_OK, EXIT_BROKEN_PIPE, 130) and not seen_out.text:
        # --json: a failure with no report still answers in JSON on stdout (the message on stderr too)
        errors = [w[len("error: "):].rstrip("\n") for w in seen_err.text if w.startswith("error: ")]  # (whole: a
        # path may hold a newline)
        from .cli_util import to_json

        try:
            out.write(to_json({"ok": False, "exit": code, "error": "; ".join(errors) or f"exit status {code}"}) + "\n")
        except (OSError, ValueError):
            pass
    return code


class _Seen:
    """A text stream that keeps what was written to it (``text``) and passes it on."""

    def __init__(self, stream: TextIO) -> None:
        self.stream, self.text = stream, []

    def write(self, s: str) -> int:
        self.text.append(s)
        return self.stream.write(s)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def _run(args, out: TextIO, err: TextIO) -> int:
    """The command's exit status; its errors written to ``err``."""
    from .checkpoint import telling_waits  # (here: --help and usage errors import no engine)

    real_out = getattr(out, "stream", out)
    try:
        with telling_waits(lambda note: _note(err, note)):
            return _commands()[args.command](args, out, err)
    except KeyboardInterrupt:
        err.write("interrupted\n")
        return 130
    except BrokenPipeError:  # the reader of the output went away (| head): nothing more to say, no one to say it to
        if real_out is sys.stdout:  # (the interpreter's flush at exit must not fail again)
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
                os.close(devnull)
            except (OSError, ValueError):
                pass
        return EXIT_BROKEN_PIPE
    except CliDamaged as e:
        err.write(f"error: {e}\n")
        return EXIT_DAMAGED
    except CliUsage as e:
        err.write(f"error: {e}\n")
        return EXIT_USAGE
    except (TqstoreError, OSError) as e:
        err.write(f"error: {e}\n")
        # damaged, or unreadable (a system call failed: permissions, a directory where a file
        # belongs, a full disk); any other error is the call's (usage)
        return EXIT_DAMAGED if isinstance(e, (CorruptionError, OSError)) else EXIT_USAGE


def _note(err: TextIO, note: str) -> None:
    """Write ``note: ...`` to stderr at once (a command blocked on a lock says what it waits for)."""
    try:
        err.write(f"note: {note}\n")
        err.flush()
    except (OSError, ValueError):
        pass
