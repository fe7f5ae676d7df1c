"""What keeping only the base commit's history costs an attempt: pruned once per image, or by every prepare.

Builds an image holding a generated repository (`--commits` commits over `--files` files, half of them on a
later branch, tagged, as a dataset clone has them), then times, in the same run: building the pruned image
once, and starting + preparing a task sandbox from it (a marker read) against starting + preparing one from
the raw image (the whole rebuild of the object store in every attempt).

    python benchmarks/history_prune.py [--commits 4000] [--files 400] [--attempts 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.core.records import Task  # noqa: E402
from pipeline.verifier.environment import prepare, task_sandbox  # noqa: E402
from sandbox.docker_sandbox import DockerSandbox  # noqa: E402
from sandbox.history import pruned_image  # noqa: E402
from sandbox.images import build_from_dockerfile, docker_client, ensure_base_image  # noqa: E402


def fast_import(commits: int, files: int) -> bytes:
    """A `git fast-import` stream: `commits` commits on main, each rewriting one of `files` files."""
    out = []
    for i in range(commits):
        body = "".join(f"line {j} of file {i % files} at commit {i}\n" for j in range(60)).encode()
        out += [b"commit refs/heads/main", f"mark :{i + 1}".encode(),
                f"committer t <t@t> {1_000_000_000 + i} +0000".encode(), b"data 9", f"commit{i:03d}"[:9].encode()]
        out += [f"from :{i}".encode()] if i else []
        out += [f"M 100644 inline src/f{i % files}.py".encode(), f"data {len(body)}".encode(), body]
    return b"\n".join(out) + b"\n"


def make_repo(path: Path, commits: int, files: int) -> None:
    subprocess.run(["git", "init", "-q", "-b", "main", str(path)], check=True)
    subprocess.run(["git", "-C", str(path), "fast-import", "--quiet"], input=fast_import(commits, files), check=True)
    half = subprocess.run(["git", "-C", str(path), "rev-parse", f"main~{commits // 2}"], capture_output=True,
                          text=True, check=True).stdout.strip()
    for command in (["tag", "v2", "main"], ["branch", "future", "main"], ["reset", "-q", "--hard", half],
                    ["gc", "-q"]):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(path), *command], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=4000)
    parser.add_argument("--files", type=int, default=400)
    parser.add_argument("--attempts", type=int, default=3)
    args = parser.parse_args()
    client, tag = docker_client(), "handhold/bench-history:1"
    with tempfile.TemporaryDirectory() as tmp:
        make_repo(Path(tmp) / "repo", args.commits, args.files)
        build_from_dockerfile(client, f"FROM {ensure_base_image(client=client)}\nUSER root\nCOPY repo /testbed\n"
                              "RUN chown -R 1000 /testbed\nUSER agent\n", tag, files={"repo": f"{tmp}/repo"})
    head = client.containers.run(tag, ["git", "-C", "/testbed", "rev-parse", "HEAD"], remove=True).decode().strip()
    task = Task(instance_id="bench__1", repo="bench/repo", base_commit=head, patch="", test_patch="",
                problem_statement="", FAIL_TO_PASS=(), PASS_TO_PASS=(), image=tag, workdir="/testbed",
                test_cmd="true", log_parser="parse_log_pytest", source="dataset")
    for old in client.images.list(name="handhold/only-reachable"):
        client.images.remove(old.id, force=True)
    begun = time.monotonic()
    pruned_image(client, tag, task.workdir, head)
    once = time.monotonic() - begun
    marker, raw = [], []
    for _ in range(args.attempts):
        begun = time.monotonic()
        with task_sandbox(task):
            marker.append(time.monotonic() - begun)
        begun = time.monotonic()
        with DockerSandbox(tag, workdir=task.workdir, base_commit=head) as sb:
            prepare(sb, task)
            raw.append(time.monotonic() - begun)
    objects = client.containers.run(tag, ["sh", "-c", "cd /testbed && git count-objects -v | grep in-pack"],
                                    remove=True).decode().split()[-1]
    print(f"repository: {args.commits} commits, {objects} objects; pruned image built once in {once:.2f} s")
    print(f"start + prepare, median of {args.attempts}: pruned image {statistics.median(marker):.2f} s, "
          f"raw image (prune per attempt) {statistics.median(raw):.2f} s, "
          f"ratio {statistics.median(raw) / statistics.median(marker):.2f}x")


if __name__ == "__main__":
    main()
