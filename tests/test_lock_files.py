"""Lock files (tqstore._io.locks): opened without following a link and without blocking on a
FIFO, yet a regular lock file under a lease held elsewhere (an NFS delegation, a Samba oplock)
is still opened and locked, as any open of it would be, once the lease is given back."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tqstore._io import locks


def test_a_lock_file_under_a_read_lease_of_another_process_is_opened_once_the_lease_is_broken(tmp_path):
    path = tmp_path / "x.lock"
    path.touch()
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, os, signal, time
        fd = os.open({str(path)!r}, os.O_RDONLY)
        def give_back(*_):
            fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
            print("given back", flush=True)
        signal.signal(signal.SIGIO, give_back)
        try:
            fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
        except OSError as e:
            print("no lease", e, flush=True)
            raise SystemExit(0)
        print("leased", flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        said = holder.stdout.readline().strip()
        if said.startswith("no lease"):
            pytest.skip(f"this file system grants no leases ({said})")
        assert said == "leased"
        # (with O_NONBLOCK alone the open failed at once with EWOULDBLOCK: BlockingIOError)
        with locks.flocked(path) as held:
            assert held
        assert holder.stdout.readline().strip() == "given back"
    finally:
        holder.kill()
        holder.wait()
