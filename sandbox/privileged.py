"""One privileged round trip that carries files both ways: inputs in, a script run, outputs back.

Every privileged command costs a round trip (a few milliseconds through a Docker sandbox's root loop, ~65 ms
as an exec of its own), and so does each file copied in or out; the grader needs a dozen of each. Here the
inputs travel as a tar on the script's standard input and the outputs come back as a tar on its
standard output, while the script's own output goes to a log that comes back with them.
"""

from __future__ import annotations

import io
import shlex
import tarfile
import time
from dataclasses import dataclass

from sandbox.base import Sandbox

LOG = "exchange.log"  # the script's own stdout and stderr, among the outputs


@dataclass(frozen=True)
class Exchanged:
    """What came back: the script's exit code and output, and every output file that existed."""

    exit_code: int
    log: str
    files: dict[str, bytes]
    duration: float  # seconds


def exchange(sandbox: Sandbox, script: str, inputs: dict[str, tuple[bytes, int]], outputs: list[str],
             timeout: float, folders: dict[str, tuple[int, int, int]] | None = None) -> Exchanged:
    """Write `inputs` (absolute path -> (bytes, mode)), run `script` as the administrator (in a subshell: its
    `exit` ends only the script), read back `outputs` (absolute paths; a missing one is left out). `folders`
    (absolute path -> (mode, uid, gid)) are made, or an existing one given that mode and owner, before the inputs
    are written (GNU tar, as root, sets an existing folder's mode and owner from the archive)."""
    start = time.monotonic()
    payload = _tar(inputs, folders or {})
    wanted = " ".join(shlex.quote(p.lstrip("/")) for p in outputs)
    command = (f"tar -xf - -C / || exit 90\n"
               f"log=$(mktemp /tmp/{LOG}.XXXXXX) && exec 9>&1 >\"$log\" 2>&1\n(\n{script}\n)\nrc=$?\n"
               f"tar -cf - --ignore-failed-read -C / {wanted} -C /tmp \"${{log#/tmp/}}\" 2>/dev/null >&9\n"
               f"rm -f \"$log\"\nexit $rc\n")
    result = sandbox.run_privileged(command, timeout, stdin=payload)
    files = _untar(result.output.encode("utf-8", "surrogateescape"))
    log = next((v for k, v in files.items() if k.startswith(f"{LOG}.")), b"")
    files = {"/" + k: v for k, v in files.items() if not k.startswith(f"{LOG}.")}
    text = log.decode("utf-8", "replace") or result.output[-2000:]
    return Exchanged(result.exit_code, text, files, time.monotonic() - start)


def _tar(inputs: dict[str, tuple[bytes, int]], folders: dict[str, tuple[int, int, int]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, (mode, uid, gid) in folders.items():
            info = tarfile.TarInfo(path.strip("/"))
            info.type, info.mode, info.uid, info.gid, info.mtime = tarfile.DIRTYPE, mode, uid, gid, time.time()
            tar.addfile(info)
        for path, (data, mode) in inputs.items():
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode, info.mtime = len(data), mode, time.time()
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _untar(data: bytes) -> dict[str, bytes]:
    if not data:
        return {}
    out = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for member in tar:
                if member.isfile():
                    out[member.name] = tar.extractfile(member).read()
    except tarfile.TarError:
        return {}  # nothing readable came back: the caller reports the script's failure
    return out
