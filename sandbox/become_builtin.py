"""`handhold_become`, the bash builtin that lets a session loop fork each command's shell (become_builtin.c).

Built once per process with the host's C compiler and handed to the loop base64-encoded on its input, before its
first request (not on its command line, which `ps` shows): no image needs to carry it. Where it cannot be built (no
compiler) or loaded (another architecture or C library in the container, a bash without loadable builtins, a state
folder mounted noexec), each command's shell is a fresh bash, run through `setpriv` where it drops to a user: two
execs, about 3 ms more a command.
"""

from __future__ import annotations

import base64
import functools
import logging
import os
import subprocess
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("become_builtin.c")


@functools.cache
def encoded() -> str:
    """The builtin compiled for this host, base64 (about 21 KB); "" where it cannot be built."""
    compiler = os.environ.get("CC", "cc")
    with tempfile.TemporaryDirectory(prefix="handhold-become-") as tmp:
        out = os.path.join(tmp, "become.so")
        try:
            subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-s", "-o", out, str(SOURCE)],
                           check=True, capture_output=True, timeout=120)
            return base64.b64encode(Path(out).read_bytes()).decode()
        except (OSError, subprocess.SubprocessError) as exc:
            detail = getattr(exc, "stderr", b"") or b""
            log.warning("cannot build the sandbox session's builtin with %s (%s %s): each command's shell is a "
                        "fresh bash (~3 ms more a command); install a C compiler, or set CC, to avoid it",
                        compiler, exc, detail.decode(errors="replace")[-500:])
            return ""
