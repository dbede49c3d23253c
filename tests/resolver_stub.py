"""A ``flodl-proto`` command line run in a child process whose resolver is replaced, for the
start-up name checks of ``relay --controller`` and ``rank --relay`` (no network, no resolver's
timing).

``python -c PATCHED_CLI MODE ARGS...`` runs ``flodl-proto ARGS...``; its first lookup of a
``.invalid`` name (the start-up check's) is answered as ``MODE`` says: ``noname`` (the name does
not exist), ``again`` (a temporary failure), ``slow`` (no answer, ever), ``sigterm`` or
``sigint`` (no answer, ever, and the process sends itself that signal as the lookup starts: a
stop while the resolver is asked, with no timing), ``sigterm-thread`` or ``sigint-thread`` (the
same, the signal sent to the lookup's thread alone, as the kernel may give a process's signal to
any of its threads: sent once the main thread waits for the lookup, which does not get it).
Later lookups of it (the dial's) find
127.0.0.1; any other name goes to the real resolver."""

from __future__ import annotations

PATCHED_CLI = """
import os, signal, socket, sys, threading, time
mode, real = sys.argv[1], socket.getaddrinfo
asked = []
def fake(host, *args, **kwargs):
    if not str(host).endswith(".invalid"):
        return real(host, *args, **kwargs)
    asked.append(host)
    if len(asked) > 1:
        return real("127.0.0.1", *args, **kwargs)
    if mode == "noname":
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    if mode == "again":
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
    if mode in ("sigterm", "sigint"):
        os.kill(os.getpid(), getattr(signal, mode.upper()))
    if mode in ("sigterm-thread", "sigint-thread"):  # once the main thread waits (asleep)
        stat = f"/proc/self/task/{threading.main_thread().native_id}/stat"
        while open(stat).read().rpartition(")")[2].split()[0] != "S":
            time.sleep(0.01)
        time.sleep(0.3)
        signal.pthread_kill(threading.get_ident(), getattr(signal, mode[:-7].upper()))
    threading.Event().wait()  # "slow" and the signal modes: never answers
socket.getaddrinfo = fake
from flodl_proto.cli import main
sys.exit(main(sys.argv[2:]))
"""
