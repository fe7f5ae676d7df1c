"""Per-command time through DockerSandbox's session versus one `docker exec` per command (and versus the
session without its `handhold_become` builtin: each command's shell a fresh bash run through setpriv),
the work-tree reset versus recreating the container, and a 30 KB source file read and written
through the session (sandbox/session_files.py) versus the engine's archive API. Prints medians
and ratios.

    python benchmarks/sandbox_exec.py [--commands 200] [--files 1000]
Targets: session median <= 3 ms and <= 0.06x docker exec; reset of 1,000 files <= 60 ms and <= 0.2x
recreating the container (exact: contents compared, untracked files removed, ignored outputs kept).
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import tarfile
import time

from sandbox import DockerSandbox, become_builtin
from sandbox.images import docker_client, ensure_base_image

REPO = "/home/agent/repo"


def time_session(sb: DockerSandbox, n: int) -> list[float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        sb.run("true")
        times.append(time.perf_counter() - start)
    return times


def time_docker_exec(sb: DockerSandbox, n: int) -> list[float]:
    """What mini-swe-agent does: a fresh `docker exec` (here through the same SDK) per command."""
    times = []
    for _ in range(n):
        start = time.perf_counter()
        sb.container.exec_run(["bash", "-lc", "true"], user=sb.user)
        times.append(time.perf_counter() - start)
    return times


def make_work_tree(sb: DockerSandbox, files: int) -> None:
    script = (
        f"mkdir -p {REPO} && cd {REPO} && git init -q && git config user.email b@b && git config user.name b"
        f" && for i in $(seq {files}); do d=pkg$((i % 20)); mkdir -p $d; echo \"x = $i\" > $d/m$i.py; done"
        " && echo build/ > .gitignore && git add -A && git commit -qm base"
    )
    assert sb.run(script, timeout=300).exit_code == 0
    sb.workdir, sb.base_commit = REPO, sb.run(f"git -C {REPO} rev-parse HEAD").output.strip()


def dirty(sb: DockerSandbox) -> None:
    """Edits (one keeping its size, in the same second), deletions, new files and an ignored build output."""
    sb.run(f"cd {REPO} && for i in $(seq 1 50); do echo changed >> pkg$((i % 20))/m$i.py; done; "
           "sed -i 's/^x/y/' pkg2/m2.py; touch new1.py new2.py; rm pkg1/m1.py; mkdir -p build; echo o > build/out.so")


def time_reset(sb: DockerSandbox, rounds: int) -> list[float]:
    times = []
    for _ in range(rounds):
        dirty(sb)
        start = time.perf_counter()
        sb.reset()
        times.append(time.perf_counter() - start)
        assert sb.diff() == "" and sb.run(f"test -f {REPO}/build/out.so").exit_code == 0
    return times


def time_recreate(image: str, rounds: int) -> list[float]:
    """The alternative to reset: throw the container away and start a fresh one."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        DockerSandbox(image, workdir="/tmp").close()
        times.append(time.perf_counter() - start)
    return times


def time_files(sb: DockerSandbox, rounds: int) -> tuple[list[float], list[float]]:
    """A read and a write of a 30 KB file: through the session, and through the archive API (the baseline)."""
    data = os.urandom(15_000).hex().encode()
    sb.write_file("/tmp/bench/file.py", data)
    session, archive = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        sb.write_file("/tmp/bench/file.py", data)
        assert sb.read_file("/tmp/bench/file.py") == data
        session.append(time.perf_counter() - start)
        start = time.perf_counter()
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo("archive.py")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        sb.container.put_archive("/tmp/bench", buf.getvalue())
        stream, _ = sb.container.get_archive("/tmp/bench/archive.py")
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            assert tar.extractfile(tar.next()).read() == data
        archive.append(time.perf_counter() - start)
    return session, archive


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", type=int, default=200)
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    image = ensure_base_image(client=docker_client())
    with DockerSandbox(image, workdir="/tmp") as sb:
        time_session(sb, 20)  # warm up
        session = statistics.median(time_session(sb, args.commands)) * 1000
        exec_ = statistics.median(time_docker_exec(sb, args.commands)) * 1000
        forked = "handhold-shell" in sb.run("tr '\\0' ' ' < /proc/$$/cmdline").output  # the loop's command line
        files, archive = (statistics.median(t) * 1000 for t in time_files(sb, args.rounds * 2))
        make_work_tree(sb, args.files)
        reset = statistics.median(time_reset(sb, args.rounds)) * 1000
    recreate = statistics.median(time_recreate(image, args.rounds)) * 1000
    builtin, become_builtin.encoded = become_builtin.encoded, lambda: ""
    with DockerSandbox(image, workdir="/tmp") as sb:  # the former way: setpriv and a fresh bash per command
        time_session(sb, 20)
        fresh = statistics.median(time_session(sb, args.commands)) * 1000
    become_builtin.encoded = builtin
    print(f"commands: {args.commands} each way")
    how = "each command's shell a fork of the loop" if forked else "NOT forked: no builtin"
    print(f"session median      {session:8.2f} ms   (target <= 3 ms; {how})")
    print(f"fresh-shell median  {fresh:8.2f} ms   (setpriv and a fresh bash per command, the former way)")
    print(f"docker exec median  {exec_:8.2f} ms")
    print(f"ratio session/exec  {session / exec_:8.3f}    (target <= 0.06)")
    print(f"reset median        {reset:8.2f} ms   ({args.files} files; target <= 60 ms)")
    print(f"recreate median     {recreate:8.2f} ms   (new container instead of reset)")
    print(f"ratio reset/recreate {reset / recreate:7.3f}    (target <= 0.2)")
    print(f"file write+read     {files:8.2f} ms   (30 KB, through the session)")
    print(f"archive API         {archive:8.2f} ms   (put_archive + get_archive, the former way)")
    print(f"ratio session/API   {files / archive:8.3f}")


if __name__ == "__main__":
    main()
