"""Runs figure scripts for scripts/figures.sh: every line of stdin "<i>\t<script>\t<results file>" runs
`<script> <results file> --out-dir <tmp>/<i>` as its own process, at most JOBS at once, its output in <tmp>/<i>.msg
and its exit code (128 + N for signal N) in <tmp>/<i>.rc.
Usage: figures_fork.py JOBS TMP < jobs
Each run is a fork of this process after it imported figstyle (h5py, numpy, matplotlib with pyplot: ~0.4 s of CPU a
start), so that a figure script that skips a file (exit 3, most of them) costs a fork instead of a python start; each
run still has a process of its own (its own figure state, argv, exit code), as when started alone.
"""
import os
import runpy
import sys
import traceback


def child(script, results, out_dir, msg):
    """In the forked process: runs `script` as __main__ with its command line, output into `msg`; never returns."""
    code = 1
    try:
        fd = os.open(msg, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        sys.argv = [script, results, "--out-dir", out_dir]
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as e:
            if e.code is None:
                code = 0
            elif isinstance(e.code, int):
                code = e.code
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except BaseException:  # a traceback, as python prints it for an uncaught exception
            traceback.print_exc()
            code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code & 0xFF)


def main():
    jobs, tmp = max(1, int(sys.argv[1])), sys.argv[2]
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    try:  # what every figure script imports; without it (no matplotlib) each run fails on its own, with its message
        import figstyle  # noqa: F401
    except Exception:
        pass
    running = {}

    def reap():
        pid, status = os.wait()
        i = running.pop(pid)
        rc = os.waitstatus_to_exitcode(status)
        with open(os.path.join(tmp, f"{i}.rc"), "w") as fh:
            fh.write(f"{rc if rc >= 0 else 128 - rc}\n")

    for line in sys.stdin:
        if not line.strip():
            continue
        i, script, results = line.rstrip("\n").split("\t")
        while len(running) >= jobs:
            reap()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            child(script, results, os.path.join(tmp, i), os.path.join(tmp, f"{i}.msg"))
        running[pid] = i
    while running:
        reap()
    return 0


if __name__ == "__main__":
    sys.exit(main())
