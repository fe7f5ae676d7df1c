"""A persistent shell session spoken to over a byte stream.

One long-lived bash loop reads requests (`<length>` a line, then the command) and runs each
command in a child bash of its own process group, so a command's whole process group can be
killed without killing the session. The child restores the previous command's cwd and
exported variables and saves them on exit, which is what makes them persist.

In a container the loop runs as root and each command's shell drops to the sandbox user, so nothing
the agent runs can delete the session's state, write into the session's stream or kill the loop. The
command's shell is a fork of the loop (a subshell) that becomes a shell of its own and drops to the
user with the `handhold_become` builtin (sandbox/become_builtin.c, loaded once by the loop), and
forgets the loop's own variables; where the builtin cannot be loaded it is a fresh bash run through
`setpriv`, two execs more (~3 ms). State and cwd reach the command through inherited descriptors (3:
the state to restore, 4: where to save it, 5: the command). The state lives in two files that swap
roles when a command saved one, so no copy is made. Each command writes to a fresh output file,
emptied once read and removed in batches, so a background process that outlives its command writes
nowhere that a later result reads. The loop answers with a header (marker, exit code, size) and at
most `cap` bytes, the head and the tail. The marker is the first line the loop reads, never on a
command line: a command's shell, a fork of the loop, shows the loop's. Per command the loop forks
once; everything else is a bash builtin, which is what keeps a command at a few milliseconds.
"""

from __future__ import annotations

import logging
import secrets
import time
from typing import Callable

from sandbox.base import OUTPUT_CAP, CommandResult

log = logging.getLogger(__name__)

STATE_DIR = "/run/handhold-shell"  # in a container: root's, mode 0700

# $1: state dir, $2: output cap in bytes, $3: workdir, $4: "uid gid home name" of the user commands
# run as ("" runs them as the loop's own user). The loop first reads the marker (a line) and the
# `handhold_become` builtin (its length, then it, base64; none, or one that does not load: each
# command's shell is a fresh bash, through setpriv for a user), then requests. Neither is on its
# command line, which `ps` shows the agent. The loop's own locale is C (not exported) so that
# `read -N` counts bytes; `set -m` gives each command its own process group, whose id goes to
# $S/pid for `interrupt`. A forked command's shell unsets the loop's variables before it restores
# the state. NUL bytes in output are dropped. A request whose length has a `P` before it is privileged:
# it runs as the loop's own user (root), in the environment the loop was started with and none of the
# session's state, and its whole output comes back byte for byte.
SERVER_SCRIPT = r"""
exec 2>/dev/null  # job notices ("[1]+ Done") must never reach the protocol stream
S="$1"; CAP="$2"; I=0; A="$S/state.0"; B="$S/state.1"; USR=; RUN=(); FORK=
(umask 077; mkdir -p "$S"); cd "$3" 2>/dev/null || cd /
RE=$(declare -p HOME USER LOGNAME LC_ALL)  # as the loop was started: a privileged command's environment
if [ -n "$4" ]; then
  read -r U G H NAME <<< "$4"; USR="$U $G $NAME"; RUN=(setpriv "--reuid=$U" "--regid=$G" --init-groups --)
  export HOME="$H" USER="$NAME" LOGNAME="$NAME"
fi
{ export -p; printf 'cd -- %q\n' "$PWD"; } > "$A"
C='. /dev/fd/3; exec 3<&-; trap '"'"'{ export -p; printf "cd -- %q\n" "$PWD"; } >&4'"'"' EXIT; . /dev/fd/5'
export -n LC_ALL; LC_ALL=C; set -m; IFS= read -r M; IFS= read -r N; IFS= read -r -d '' -N "$N" SO
[ -n "$SO" ] && base64 -d <<< "$SO" > "$S/become.so" && enable -f "$S/become.so" handhold_become &&
  ( handhold_become $USR && [ "$$ $(id -u)" = "$BASHPID ${U:-$(id -u)}" ] ) && FORK=1; SO=
while IFS= read -r N; do
  P=; [ "${N#P}" = "$N" ] || { P=1; N="${N#P}"; }
  IFS= read -r -d '' -N "$N" CMD; printf '%s' "$CMD" > "$S/cmd"
  I=$((I + 1)); O="$S/out.$I"; [ $((I % 64)) = 0 ] && rm -f "$S"/out.*
  if [ -n "$P" ]; then
    ( unset -v S CAP I A B USR RUN FORK SO M U G H NAME C N CMD O EC OUT T P HOME USER LOGNAME LC_ALL OLDPWD
      eval "$RE"; unset -v RE; set +m --; BASH_ARGV0=bash; . /dev/fd/5
    ) < /dev/null > "$O" 2>&1 5< "$S/cmd" &
  elif [ -n "$FORK" ]; then
    ( handhold_become $USR || exit 126
      unset -v S CAP I A B USR RUN FORK SO M U G H NAME C N CMD O EC OUT T P RE LC_ALL; set +m --; BASH_ARGV0=bash
      . /dev/fd/3; exec 3<&-; trap '{ export -p; printf "cd -- %q\n" "$PWD"; } >&4' EXIT; . /dev/fd/5
    ) < /dev/null > "$O" 2>&1 3< "$A" 4> "$B" 5< "$S/cmd" &
  else
    "${RUN[@]}" bash --noprofile --norc -c "$C" < /dev/null > "$O" 2>&1 3< "$A" 4> "$B" 5< "$S/cmd" &
  fi
  printf '%s\n' "$!" > "$S/pid"; printf '%s\n' "$!" >> "$S/pgids"; wait "$!"
  EC=$?; OUT=
  if [ -n "$P" ]; then
    : > "$S/cmd"; printf '%s %d %d\n' "$M" "$EC" "$(stat -c %s "$O")"; cat "$O"; : > "$O"; continue
  fi
  [ -s "$B" ] && { T="$A"; A="$B"; B="$T"; }
  IFS= read -r -d '' -N $((CAP + 1)) OUT < "$O"
  if [ "${#OUT}" -le "$CAP" ]; then
    printf '%s %d %d\n%s' "$M" "$EC" "${#OUT}" "$OUT"
  else
    N=$(stat -c %s "$O"); printf '%s %d %d\n' "$M" "$EC" "$N"
    head -c $((CAP / 2)) "$O"; tail -c $((CAP - CAP / 2)) "$O"
  fi
  : > "$O"
done
"""

KILL_GRACE = 10.0  # seconds the loop gets to answer once its command was killed


class ShellClosed(Exception):
    """The session's stream ended or hung: the shell must be restarted."""


class ShellSession:
    """Speaks the protocol above over `send(bytes)` and `recv(timeout)`.

    `recv` returns the next bytes, b"" once the stream has ended, or None when nothing
    came within `timeout` seconds.
    """

    def __init__(self, send: Callable[[bytes], None], recv: Callable[[float], bytes | None],
                 interrupt: Callable[[], None], cap: int = OUTPUT_CAP, become: str = ""):
        self._send, self._recv, self._interrupt = send, recv, interrupt
        self.cap = cap
        self.marker = "__HANDHOLD_" + secrets.token_hex(8) + "__"
        # what the loop reads first (the marker, the builtin), sent with the first command
        self._greeting = f"{self.marker}\n{len(become)}\n{become}".encode()
        self._buf = b""

    def run(self, command: str, timeout: float, privileged: bool = False) -> CommandResult:
        """Run `command` in the session; `privileged`: as the loop's own user, apart from the session's state,
        its whole output decoded with surrogateescape (encoding it back gives the bytes)."""
        start = time.monotonic()
        data = command.replace("\0", "").encode()
        self._send(self._greeting + f"{'P' if privileged else ''}{len(data)}\n".encode() + data)
        self._greeting = b""
        self._deadline, self._timed_out = start + timeout, False
        header = self._read_header()
        _, code, size = header.split(b" ")
        exit_code, size = int(code), int(size)
        cap = size if privileged else self.cap
        body = self._read_exact(min(size, cap))
        duration = time.monotonic() - start
        cut = max(size - cap, 0)
        output = body.decode("utf-8", "surrogateescape") if privileged else _decode(body, cut, cap)
        return CommandResult(exit_code=exit_code, output=output, duration=duration, timed_out=self._timed_out,
                             cut_bytes=cut)

    def _read_header(self) -> bytes:
        marker = self.marker.encode()
        while True:
            at = self._buf.find(marker)
            if at >= 0:
                end = self._buf.find(b"\n", at)
                if end >= 0:
                    header = self._buf[at:end]
                    self._buf = self._buf[end + 1:]
                    return header
            self._fill()

    def _read_exact(self, n: int) -> bytes:
        while len(self._buf) < n:
            self._fill()
        data, self._buf = self._buf[:n], self._buf[n:]
        return data

    def _fill(self) -> None:
        while True:
            left = self._deadline - time.monotonic()
            if left <= 0 and not self._timed_out:
                self._interrupt()  # kill the command's process group; the loop then answers
                self._timed_out = True
                self._deadline = time.monotonic() + KILL_GRACE
                continue
            if left <= 0:
                raise ShellClosed("the shell did not answer after the command was killed")
            chunk = self._recv(left)
            if chunk == b"":
                raise ShellClosed("the shell exited")
            if chunk is not None:
                self._buf += chunk
                return


def run_or_restart(shell: ShellSession, restart: Callable[[], None], command: str, timeout: float,
                   name: str) -> CommandResult:
    """Run on the session; if the shell hung or exited, restart it and say so in the result."""
    try:
        return shell.run(command, timeout)
    except (ShellClosed, OSError) as exc:
        log.warning("sandbox %s: shell lost (%s); restarting it", name, exc)
        restart()
        return CommandResult(exit_code=-1, output=f"[the shell was lost ({exc}) and restarted; "
                             "cwd and exported variables were reset]", duration=timeout,
                             timed_out=True, shell_restarted=True)


def _decode(body: bytes, cut: int, cap: int) -> str:
    if not cut:
        return body.decode("utf-8", errors="replace")
    head, tail = body[: cap // 2], body[cap // 2:]
    return (
        head.decode("utf-8", errors="replace")
        + f"\n[... {cut} bytes of output cut ...]\n"
        + tail.decode("utf-8", errors="replace")
    )


def interrupt_command(state_dir: str) -> str:
    """Shell that kills the running command's process group and returns once none of its members is alive (2 s at
    most): the loop answers when the command's own shell is reaped, while the rest of its pipeline dies on the
    kernel's time, and the next command must not see it. Zombies do not count (an orphan's is reaped by PID 1,
    slowly where that is no real init); without `ps` it returns at once."""
    return (f"g=$(cat {state_dir}/pid) && kill -s KILL -- -$g 2>/dev/null; i=0; while [ $i -lt 200 ] && "
            f"ps -e -o pgid=,stat= 2>/dev/null | awk -v g=$g '$1 == g && $2 !~ /^Z/ {{f = 1}} END {{exit !f}}'; "
            f"do sleep 0.01; i=$((i + 1)); done; true")


def kill_all_command(state_dir: str) -> str:
    """Shell that kills every process group the session's commands started (a fork bomb included)."""
    return (f"for g in $(cat {state_dir}/pgids 2>/dev/null); do kill -s KILL -- -$g 2>/dev/null; done; "
            f"rm -f {state_dir}/pgids; true")


def restart_kill_command(state_dir: str) -> str:
    """Shell (run as root, after the user's `kill -KILL -1` where commands drop to a user) that ends what a lost
    session left, so a new loop can start: a lost session takes its processes with it; under a fork bomb an exec
    can fail to fork, so the caller tries a few times. The user's `kill -1` signals every process of the user in
    one pass of the kernel, which no fork slips past (a bomb left one process refills the pids, and the new loop,
    unable to fork, exits). Then root's leftovers (the old loop: the pattern is anchored, since this script's own
    command line holds it too)."""
    return f"{kill_all_command(state_dir)}; pkill -KILL -f '^bash --noprofile --norc -c .*handhold-shell'; true"


def server_argv(state_dir: str, cap: int, workdir: str, run_as: str = "") -> list[str]:
    """The command line that starts the session's server loop (`run_as`: "uid gid home name" or "")."""
    return ["bash", "--noprofile", "--norc", "-c", SERVER_SCRIPT, "handhold-shell", state_dir, str(cap), workdir,
            run_as]
