"""Run a Python script, ``-c`` code or ``-m`` module as a new process forked from a server that
imported torch, numpy, tqstore and tensordict once (importing them takes seconds of every fresh
interpreter here; the docs' blocks and the tutorials would spend most of their time on it).

The child is what ``python <script>`` would be after those imports: its own working
directory, environment (``PYTHONPATH`` entries put first on ``sys.path``), ``sys.argv``, a
``__main__`` of its own, stdout and stderr captured, Python's default signal handlers, the
interpreter's exit (non-daemon threads are waited for, atexit handlers run, then ``os._exit``
without tearing the modules down) and its exit code; a child past its timeout is killed.  Not for tests about what gets imported (the server's
modules are already there) nor for children a test must signal itself.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
from typing import Dict, List, Optional, Sequence

_SERVER = textwrap.dedent(r"""
    import json, os, signal, sys, time
    import numpy, torch, tqstore  # noqa: F401 - what every child gets for free
    try:
        import tensordict  # noqa: F401 - the stores' batches (another second and a half)
    except ImportError:
        pass

    def child(req):
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        extra = [p for p in req["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:0] = extra
        for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
            f = os.open(path, os.O_WRONLY | os.O_TRUNC)
            os.dup2(f, fd)
            os.close(f)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        sys.stdin = open(0, closefd=False)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for s in (signal.SIGTERM, signal.SIGPIPE, signal.SIGCHLD):
            signal.signal(s, signal.SIG_DFL)
        import runpy
        kind, target, args = req["kind"], req["target"], req["args"]
        if kind == "module":
            sys.argv = [target] + args
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            if kind == "path":
                sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
            sys.argv = ([target] if kind == "path" else ["-c"]) + args
            if kind == "code":
                sys.path.insert(0, "")
                code = compile(target, "<string>", "exec")
                main = type(sys)("__main__")
                main.__dict__["__builtins__"] = __builtins__
                sys.modules["__main__"] = main
                exec(code, main.__dict__)
            else:
                runpy.run_path(target, run_name="__main__")

    print("ready", flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            # the interpreter's exit, without tearing down the modules torch brought (half a second)
            import atexit, threading, traceback
            try:
                child(req)
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 0 if e.code is None else (print(e.code, file=sys.stderr), 1)[1]
            except BaseException:  # noqa: BLE001 - reported as Python reports it
                traceback.print_exc()
                code = 1
            try:
                threading._shutdown()
                atexit._run_exitfuncs()
            finally:
                for f in (sys.stdout, sys.stderr):
                    try:
                        f.flush()
                    except Exception:  # noqa: BLE001
                        pass
                os._exit(code)
        deadline = time.monotonic() + req["timeout_s"]
        timed_out = False
        while True:
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                timed_out = True
                os.kill(pid, signal.SIGKILL)
                _, st = os.waitpid(pid, 0)
                break
            time.sleep(0.005)
        code = os.waitstatus_to_exitcode(st)
        print(json.dumps({"returncode": code, "timed_out": timed_out}), flush=True)
""")


class ForkServer:
    """One server process; :meth:`run` is thread-safe (one child at a time)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._p = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   text=True)
        ready = self._p.stdout.readline().strip()
        if ready != "ready":
            raise RuntimeError(f"fork server did not start (said {ready!r})")

    def run(self, kind: str, target: str, args: Sequence[str] = (), *, cwd: str, env: Optional[Dict[str, str]] = None,
            timeout: float = 600.0) -> subprocess.CompletedProcess:
        """Run ``target`` (``kind``: "path", "code" or "module") like ``subprocess.run([python, ...],
        capture_output=True, text=True)``; raises ``subprocess.TimeoutExpired`` past ``timeout``."""
        with tempfile.TemporaryDirectory(prefix="forkrun-") as d:
            out, err = os.path.join(d, "out"), os.path.join(d, "err")
            for p in (out, err):
                open(p, "w").close()
            req = {"kind": kind, "target": target, "args": list(map(str, args)), "cwd": str(cwd),
                   "env": dict(os.environ if env is None else env), "stdout": out, "stderr": err, "timeout_s": timeout}
            with self._lock:
                self._p.stdin.write(json.dumps(req) + "\n")
                self._p.stdin.flush()
                line = self._p.stdout.readline()
            if not line:
                raise RuntimeError("fork server died")
            reply = json.loads(line)
            with open(out, encoding="utf-8", errors="replace") as f:
                stdout = f.read()
            with open(err, encoding="utf-8", errors="replace") as f:
                stderr = f.read()
        argv: List[str] = [sys.executable, {"path": target, "code": "-c", "module": "-m"}[kind]] + list(args)
        if reply["timed_out"]:
            raise subprocess.TimeoutExpired(argv, timeout, stdout, stderr)
        return subprocess.CompletedProcess(argv, reply["returncode"], stdout, stderr)

    def close(self) -> None:
        self._p.stdin.close()
        self._p.wait(timeout=60)
