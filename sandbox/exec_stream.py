"""A privileged command in an exec of its own, whose output cannot be lost.

The engine waits at most 2 s after an exec's process exits for the process's output to be copied out, then
closes the streams (moby, daemon/monitor.go); on a loaded machine the output of a short command was lost that
way (`cat` of a file came back empty). So the process outlives its output: the command's output (its stderr
into its stdout, in order) ends with a marker, and the process exits only once the client has read the marker
and answered on the process's standard input. Nothing is in flight when it exits.
"""

from __future__ import annotations

import secrets
import socket
import struct
import time

from sandbox.base import CommandResult, SandboxError

# $1: seconds, $2: the command, $3: the marker, $4: how many of the caller's bytes the command reads on its standard
# input, then an end of file (0: it reads nothing, /dev/null; `head` reads no byte past them, and the stream stays
# open for the answer). The answer is awaited at most a minute: a client gone leaves no process.
WRAPPER = ('if [ "$4" -gt 0 ]; then head -c "$4" | timeout -k 5 "$1" bash --noprofile --norc -c "$2" 2>&1; '
           'else timeout -k 5 "$1" bash --noprofile --norc -c "$2" < /dev/null 2>&1; fi; '
           'rc=$?; printf %s "$3"; read -r -t 60 _; exit $rc')


def exec_socket(client, exec_id: str) -> socket.socket:
    """A started exec's stream as a socket of its own. docker-py hands out the HTTP response's socket while the
    response (kept alive in a reference cycle with it) still owns it: when that cycle was collected, the response
    closed its connection, and with it the socket of a live shell ("shell lost ([Errno 9] Bad file descriptor)",
    seen at 32-64 attempts at once). So the stream is duplicated and the response closed at once: nothing else
    holds the descriptor the caller uses. A TLS stream (a remote engine over https) cannot be duplicated and is
    returned as it is."""
    stream = client.api.exec_start(exec_id, socket=True)
    raw = getattr(stream, "_sock", stream)
    if type(raw) is not socket.socket:  # a TLS or SSH channel: its state cannot be shared
        return raw
    own = raw.dup()
    response = getattr(stream, "_response", None)
    try:  # the response closes its reader and its connection, and so the original descriptor: `own` is another
        (response or stream).close()
    except (OSError, ValueError):  # already closed
        pass
    raw.close()
    return own


def privileged_argv(command: str, timeout: float, stdin_bytes: int) -> tuple[list[str], bytes]:
    """The exec's command line and the marker its output ends with."""
    marker = f"\n__HANDHOLD_END_{secrets.token_hex(8)}__"
    argv = ["bash", "--noprofile", "--norc", "-c", WRAPPER, "handhold-privileged", str(max(int(timeout), 1)),
            command, marker, str(stdin_bytes)]
    return argv, marker.encode()


def run_in_exec(client, container_id: str, command: str, timeout: float, stdin: bytes) -> CommandResult:
    """Run `command` as root in an exec of its own, `stdin` on its standard input; stdout and stderr together,
    decoded with surrogateescape. Docker's errors (APIError, OSError) are the caller's to report."""
    start = time.monotonic()
    argv, marker = privileged_argv(command, timeout, len(stdin))
    exec_id = client.api.exec_create(container_id, argv, stdin=True, stdout=True, stderr=True, user="root")["Id"]
    sock = exec_socket(client, exec_id)
    try:
        sock.sendall(stdin)  # the command reads this many bytes, then an end of file (WRAPPER)
        output = read_output(sock, marker, timeout + 30)
    finally:
        sock.close()
    code = client.api.exec_inspect(exec_id)["ExitCode"]
    return CommandResult(code if code is not None else -1, output.decode("utf-8", errors="surrogateescape"),
                         time.monotonic() - start, timed_out=code == 124)


def read_output(sock, marker: bytes, timeout: float) -> bytes:
    """The command's output, once its marker came (then the process is told to exit and the stream drained), or
    whatever came before the stream ended (the process was killed: no marker)."""
    reader = _Frames(sock, time.monotonic() + timeout, timeout)
    while not reader.out.endswith(marker):
        if not reader.read():
            return bytes(reader.out + reader.err)
    try:
        sock.sendall(b"\n")
    except OSError:
        pass
    reader.deadline = time.monotonic() + 30
    while reader.read():
        pass
    return bytes(reader.out[:-len(marker)] + reader.err)


class _Frames:
    """The multiplexed exec stream, frame by frame: 8-byte header (stream, 3 pad, length), then the bytes."""

    def __init__(self, sock, deadline: float, timeout: float):
        self.sock, self.deadline, self.timeout = sock, deadline, timeout
        self.out, self.err, self._buf = bytearray(), bytearray(), b""

    def read(self) -> bool:
        """Read what is there; False once the stream ended."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise SandboxError(f"a privileged command did not end within {self.timeout:.0f} s")
        self.sock.settimeout(left)
        try:
            chunk = self.sock.recv(1 << 16)
        except socket.timeout as exc:
            raise SandboxError(f"a privileged command did not end within {self.timeout:.0f} s") from exc
        if not chunk:
            return False
        self._buf += chunk
        while len(self._buf) >= 8:
            kind, size = struct.unpack(">BxxxL", self._buf[:8])
            if len(self._buf) < 8 + size:
                break
            (self.out if kind == 1 else self.err).extend(self._buf[8:8 + size])
            self._buf = self._buf[8 + size:]
        return True


class StdoutFrames:
    """The stdout bytes of a multiplexed exec stream as they come (a shell session's); stderr frames are dropped,
    since the engine does not keep their order relative to stdout."""

    def __init__(self, sock):
        self.sock, self._left, self._header, self._stream = sock, 0, b"", 1

    def recv(self, timeout: float) -> bytes | None:
        """The next stdout bytes, b"" once the stream ended, None when nothing came within `timeout` seconds."""
        self.sock.settimeout(timeout)
        try:
            while True:
                while self._left == 0:  # 8-byte frame header: stream, 3 pad, length
                    more = self.sock.recv(8 - len(self._header))
                    if not more:
                        return b""
                    self._header += more
                    if len(self._header) == 8:
                        self._stream, self._left = struct.unpack(">BxxxL", self._header)
                        self._header = b""
                chunk = self.sock.recv(min(self._left, 1 << 16))
                if not chunk:
                    return b""
                self._left -= len(chunk)
                if self._stream == 1:
                    return chunk
        except socket.timeout:
            return None
