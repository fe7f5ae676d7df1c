"""A container's files read and written through its shell session, as the user its commands run as.

Like anything the agent runs, a file that user may not read or write is refused (PermissionError),
wherever it is; root's own files stay root's. Contents travel as base64, in chunks whose answer fits
the session's output cap. A command is a few milliseconds where the engine's archive API takes about
100 (benchmarks/sandbox_exec.py).
"""

from __future__ import annotations

import base64
import errno
import os
import posixpath
import shlex

from sandbox.base import SandboxError

WRITE_CHUNK = 1 << 20  # bytes of a file one command writes
# The tools from the system's PATH (`command -p`), not from one the session's commands exported
STAT, HEAD, TAIL, BASE64, MKDIR = (f"command -p {tool}" for tool in ("stat", "head", "tail", "base64", "mkdir"))
NOT_A_FILE = {"dir": (IsADirectoryError, errno.EISDIR), "special": (IsADirectoryError, errno.EISDIR),
              "missing": (FileNotFoundError, errno.ENOENT), "unreadable": (PermissionError, errno.EACCES)}


def read(sandbox, target: str, path: str) -> bytes:
    """The bytes of `target` (absolute); `path` names it in errors."""
    quoted, chunk = shlex.quote(target), max((sandbox.config.output_cap - 200) // 4 * 3, 3)
    first = sandbox.run(f"f={quoted}; if [ -d \"$f\" ]; then echo dir; elif [ ! -e \"$f\" ]; then echo missing; "
                        f"elif [ ! -f \"$f\" ]; then echo special; elif [ ! -r \"$f\" ]; then echo unreadable; "
                        f"else {STAT} -L -c 'file %s' -- \"$f\" && {HEAD} -c {chunk} -- \"$f\" | {BASE64} -w0; fi",
                        60)
    status, _, body = first.output.partition("\n")
    if first.exit_code != 0 or not status.startswith(("file ", *NOT_A_FILE)):
        raise SandboxError(f"reading {path} in {sandbox.short_id} failed (exit {first.exit_code}): "
                           f"{first.output[-500:]}")
    if not status.startswith("file "):
        error, code = NOT_A_FILE[status]
        raise error(code, os.strerror(code), path)
    size, data = int(status[5:]), base64.b64decode(body)
    while len(data) < size:  # past the first chunk
        more = sandbox.run(f"{TAIL} -c +{len(data) + 1} -- {quoted} | {HEAD} -c {chunk} | {BASE64} -w0", 60)
        if more.exit_code != 0 or not more.output:
            raise SandboxError(f"reading {path} in {sandbox.short_id} failed at byte {len(data)}: "
                               f"{more.output[-500:]}")
        data += base64.b64decode(more.output)
    return data


def write(sandbox, target: str, path: str, data: bytes | str) -> None:
    """Create or replace `target` (absolute), parents made; an existing file is rewritten in place, so it keeps
    its mode and owner."""
    data = data.encode() if isinstance(data, str) else data
    quoted = shlex.quote(target)
    for at in range(0, max(len(data), 1), WRITE_CHUNK):
        encoded = base64.b64encode(data[at:at + WRITE_CHUNK]).decode()
        start = f"{MKDIR} -p -- {shlex.quote(posixpath.dirname(target))} && " if at == 0 else ""
        result = sandbox.run(f"{start}builtin printf %s '{encoded}' | {BASE64} -d {'>' if at == 0 else '>>'} {quoted}",
                             60)
        if result.exit_code != 0:
            message = result.output.strip()[-500:]
            if "Permission denied" in message:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
            raise SandboxError(f"writing {path} in {sandbox.short_id} failed (exit {result.exit_code}): {message}")
