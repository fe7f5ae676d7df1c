"""Behaviour of both sandboxes, against a real Docker engine and real subprocesses."""

from __future__ import annotations

import base64
import secrets
import threading
import time

import pytest

from sandbox import DockerSandbox, LocalSandbox, Sandbox, SandboxSpec, reap
from sandbox.base import SandboxError
from sandbox.images import LABEL, SANDBOX_USER

REPO_SETUP = (
    "mkdir -p {wd} && cd {wd} && git init -q && git config user.email t@t && git config user.name t "
    "&& printf 'a\\nb\\n' > f.txt && mkdir -p pkg && printf 'x = 1\\n' > pkg/m.py "
    "&& git add -A && git commit -qm base"
)


@pytest.fixture(params=["docker", "local"])
def sandbox(request, tmp_path):
    if request.param == "docker":
        base_image = request.getfixturevalue("base_image")
        sb = DockerSandbox(base_image, workdir="/home/agent")
    else:
        sb = LocalSandbox()
    yield sb
    sb.close()


def make_repo(sb: Sandbox) -> str:
    """A small git repo inside the sandbox; its path, with base_commit pointed at it."""
    wd = sb.workdir.rstrip("/") + "/repo"
    assert sb.run(REPO_SETUP.format(wd=wd)).exit_code == 0
    sb.run(f"cd {wd}")
    sb.workdir = wd
    sb.base_commit = sb.run(f"git -C {wd} rev-parse HEAD").output.strip()
    return wd


def test_commands_and_exit_codes(sandbox):
    assert isinstance(sandbox, Sandbox)
    result = sandbox.run("echo hello; echo oops >&2; exit 3")
    assert result.exit_code == 3
    assert "hello" in result.output and "oops" in result.output
    assert result.duration > 0 and not result.timed_out


def test_cwd_and_env_persist(sandbox):
    sandbox.run("mkdir -p /tmp/hh-x && cd /tmp/hh-x && export HH_VAR=42")
    assert sandbox.run("pwd; echo $HH_VAR").output.split() == ["/tmp/hh-x", "42"]
    sandbox.run("exit 5")  # exiting the command's shell keeps the state it reached
    assert sandbox.run("pwd").output.strip() == "/tmp/hh-x"


def test_timeout_kills_command_and_keeps_session(sandbox):
    sandbox.run("export KEEP=yes")
    start = time.monotonic()
    seconds = f"100.{secrets.randbelow(10**6):06d}"  # this test's own `sleep`: a host's `ps` lists every other's too
    result = sandbox.run(f"sleep {seconds} | cat; echo never", timeout=2)
    elapsed = time.monotonic() - start
    assert result.timed_out and "never" not in result.output
    assert elapsed < 6
    # No live `sleep` is left. A killed one may stay a zombie until its new parent reaps it (slowly on a loaded
    # machine), and pgrep counts zombies: a CI run saw one.
    after = sandbox.run(f"echo $KEEP; ps -e -o stat=,args= | "
                        f"awk '$1 !~ /^Z/ && /[s]leep {seconds}/ {{f = 1}} END {{print f ? \"alive\" : \"no-sleep\"}}'")
    assert after.output.split() == ["yes", "no-sleep"]


def test_stdin_is_empty(sandbox):
    result = sandbox.run("cat; read x; echo read=$?", timeout=5)
    assert not result.timed_out and "read=1" in result.output


def test_background_process_does_not_hang(sandbox):
    result = sandbox.run("sleep 60 & echo started", timeout=10)
    assert result.output.strip() == "started" and result.duration < 5
    assert sandbox.run("echo next").output.strip() == "next"


def test_large_output_is_capped(sandbox):
    result = sandbox.run("head -c 5000000 /dev/zero | tr '\\0' 'a'; echo END")
    assert result.cut_bytes > 4_800_000
    assert "bytes of output cut" in result.output
    assert result.output.endswith("END\n") and result.output.startswith("aaaa")
    assert len(result.output) < 200_000


@pytest.mark.docker
def test_output_past_the_session_folder_is_cut_and_the_session_lives(base_image):
    from sandbox.docker_sandbox import SESSION_TMPFS

    with DockerSandbox(base_image, workdir="/tmp") as sb:
        flood = sb.run(f"head -c $(( {SESSION_TMPFS.rstrip('m')} * 2 ))M /dev/zero | tr '\\0' a; echo END")
        # Writes past the folder's size fail (so `echo END` does), the head and tail come back.
        assert flood.exit_code != 0 and flood.output.startswith("aaaa") and "bytes of output cut" in flood.output
        assert sb.run("echo alive; df --output=used /run/handhold-shell | tail -1").output.split()[0] == "alive"
        assert int(sb.run_privileged("du -sk /run/handhold-shell | cut -f1", 30).output) < 1024  # emptied once read


def test_non_utf8_output(sandbox):
    result = sandbox.run("printf 'ok \\xff\\xfe bytes\\n'")
    assert result.output.startswith("ok ") and "\ufffd" in result.output


def test_file_round_trip(sandbox):
    data = bytes(range(256)) * 10
    sandbox.write_file("/tmp/hh-files/deep/blob.bin", data)
    assert sandbox.read_file("/tmp/hh-files/deep/blob.bin") == data
    sandbox.write_file("/tmp/hh-files/text.txt", "héllo\n")
    assert sandbox.run("cat /tmp/hh-files/text.txt").output == "héllo\n"
    with pytest.raises(FileNotFoundError):
        sandbox.read_file("/tmp/hh-files/missing")


def test_diff_and_reset(sandbox):
    make_repo(sandbox)
    sandbox.write_file("f.txt", "a\nB\n")
    sandbox.write_file("new.py", "print(1)\n")
    sandbox.run("mkdir -p pkg/__pycache__ && echo junk > pkg/__pycache__/m.pyc")
    patch = sandbox.diff()
    assert "-b\n+B" in patch and "new.py" in patch and "__pycache__" not in patch
    sandbox.run("echo build > .git/info/exclude && mkdir -p build && echo out > build/lib.so")
    sandbox.run("touch -d '2001-01-01 00:00:00 UTC' pkg/m.py")
    sandbox.reset()
    assert sandbox.diff() == ""
    assert sandbox.run("stat -c %Y pkg/m.py").output.strip() == "978307200"  # kept: its bytecode stays valid
    assert sandbox.read_file("f.txt") == b"a\nb\n"
    assert sandbox.run("test -e new.py").exit_code == 1
    assert sandbox.read_file("build/lib.so") == b"out\n"  # ignored build outputs stay


def test_reset_ignores_what_the_agent_did_to_the_index(sandbox):
    """Flags that make git skip a file, set by the agent, must not let a changed file through the reset."""
    make_repo(sandbox)
    sandbox.run("git update-index --assume-unchanged f.txt && git update-index --skip-worktree pkg/m.py "
                "&& printf 'a\\nB\\n' > f.txt && printf 'x = 2\\n' > pkg/m.py && touch -d '2001-01-01' f.txt pkg/m.py")
    sandbox.reset()
    assert (sandbox.read_file("f.txt"), sandbox.read_file("pkg/m.py")) == (b"a\nb\n", b"x = 1\n")
    assert sandbox.diff() == "" and sandbox.run("git ls-files -v").output.split() == ["H", "f.txt", "H", "pkg/m.py"]


def test_later_resets_start_from_an_index_the_agent_cannot_write(sandbox):
    """The first reset compares every file; the later ones trust the stat data of the index it left, kept out
    of the agent's reach. A same-size edit whose mtime is put back, a second after that index, under a config
    telling git to trust size and mtime alone, is still undone; an untouched file is not rewritten."""
    make_repo(sandbox)
    sandbox.run("sleep 1.1")  # the files older than the index the reset writes: none racily clean
    sandbox.reset()
    untouched = sandbox.run("stat -c %Z pkg/m.py").output
    for round_ in range(2):
        sandbox.run("sleep 1.1 && git config core.trustctime false && git config core.checkStat minimal "
                    "&& git config core.ignoreStat true && touch -r f.txt /tmp/hh-ref && printf 'a\\nB\\n' > f.txt "
                    "&& touch -r /tmp/hh-ref f.txt && git update-index --assume-unchanged f.txt && touch new.py")
        assert "-b\n+B" in sandbox.diff(), round_
        sandbox.reset()
        assert sandbox.read_file("f.txt") == b"a\nb\n" and sandbox.diff() == "", round_
        assert sandbox.run("test -e new.py").exit_code == 1
    assert sandbox.run("stat -c %Z pkg/m.py").output == untouched
    if isinstance(sandbox, DockerSandbox):
        kept = sandbox.run("test -r /run/handhold-index/index && echo readable; { echo x > /run/handhold-index/index; } "
                           "2>/dev/null || echo refused; touch /run/handhold-index/other 2>/dev/null || echo refused")
        assert kept.output.split() == ["readable", "refused", "refused"], kept.output


@pytest.mark.docker
def test_a_fresh_trees_index_is_kept_for_the_diff_only_when_it_holds_the_base(base_image):
    """A fresh sandbox keeps its tree's index out of the agent's reach when the index holds exactly the base tree:
    the diff then starts from its stat data, and still sees a same-size edit whose mtime is put back, a second
    later, under a config telling git to trust size and mtime alone. An index that holds more than the base
    is not kept."""
    with DockerSandbox(base_image, workdir="/home/agent") as sb:
        make_repo(sb)
        sb.run("printf 'x = 9\\n' > pkg/m.py && git add pkg/m.py && printf 'x = 1\\n' > pkg/m.py")
        sb.keep_index()
        kept = "test -e /run/handhold-index/index && echo kept || echo none"
        assert sb.run_privileged(kept, 30).output.split() == ["none"]
        assert sb.diff() == ""
        sb.run("git reset -q && sleep 1.1")
        sb.keep_index()
        assert sb.run_privileged(kept, 30).output.split() == ["kept"]
        mine = sb.run("test -r /run/handhold-index/index && echo readable; { echo x > /run/handhold-index/index; } "
                      "2>/dev/null || echo refused")
        assert mine.output.split() == ["readable", "refused"], mine.output
        sb.run("git config core.trustctime false && git config core.checkStat minimal && git config core.ignoreStat "
               "true && touch -r f.txt /tmp/hh-ref && printf 'a\\nB\\n' > f.txt && touch -r /tmp/hh-ref f.txt "
               "&& git update-index --assume-unchanged f.txt && rm .git/index && touch new.py")
        patch = sb.diff()
        assert "-b\n+B" in patch and "diff --git a/new.py b/new.py" in patch and "pkg/m.py" not in patch, patch
        sb.reset()
        assert sb.read_file("f.txt") == b"a\nb\n" and sb.diff() == ""


def test_diff_and_reset_run_no_program_the_agent_configured(sandbox):
    """An fsmonitor the agent sets in .git/config runs as git reads the tree, and may answer that nothing
    changed: the diff and the reset never ask it."""
    make_repo(sandbox)
    hook, marker = f"{sandbox.scratch}/fsmonitor.sh", f"{sandbox.scratch}/fsmonitor-ran"
    sandbox.write_file(hook, f"#!/bin/sh\ntouch {marker}\nprintf '\\0'\n")
    sandbox.run(f"chmod +x {hook} && git config core.fsmonitor {hook} && git config core.hooksPath /nowhere "
                "&& printf 'a\\nB\\n' > f.txt")
    assert "-b\n+B" in sandbox.diff()
    sandbox.reset()
    assert sandbox.read_file("f.txt") == b"a\nb\n" and sandbox.diff() == ""
    assert sandbox.run(f"test -e {marker}").exit_code == 1


def test_shell_exit_is_restarted_and_reported(sandbox):
    if isinstance(sandbox, DockerSandbox):  # the agent cannot kill the root loop: only the engine side can
        sandbox.container.exec_run(["pkill", "-KILL", "-f", "handhold-shell"], user="root")
        result = sandbox.run("echo lost", timeout=5)
    else:
        result = sandbox.run("kill -9 $PPID", timeout=5)
    assert result.shell_restarted and result.exit_code == -1
    assert sandbox.run("echo alive").output.strip() == "alive"


def write_with(sandbox: Sandbox, how: str, old: str, new: str) -> None:
    """Make one same-size edit of repo/m.py with one of the agent's writers."""
    from pipeline.agent.tools import execute

    if how == "edit_tool":
        result = execute(sandbox, "edit", {"command": "str_replace", "path": "m.py", "old_str": old, "new_str": new})
        assert not result.error, result.output
    elif how == "write_file":
        sandbox.write_file("m.py", sandbox.read_file("m.py").decode().replace(old, new, 1))
    else:
        assert sandbox.run(f"sed -i '0,/{old}/s//{new}/' m.py").exit_code == 0


@pytest.mark.parametrize("how", ["edit_tool", "write_file", "sed"])
def test_same_size_edit_right_after_setup_is_in_the_diff(sandbox, how):
    """An edit that keeps the file's size, in the second of the setup commit, diffed a second later (three
    repositories, edited one after the other, then one wait)."""
    edits, root = [("2", "1"), ("a + 1", "1 + a"), ("2", "3")], sandbox.workdir.rstrip("/")
    repos = []
    for round, (old, new) in enumerate(edits):
        wd = f"{root}/repo{round}"
        sandbox.run(f"rm -rf {wd}; mkdir -p {wd} && cd {wd} && printf 'a = 2\\nb = a + 1\\n' > m.py && git init -q "
                    "&& git add -A && git -c user.name=t -c user.email=t@t commit -qm base")
        sandbox.workdir = wd
        repos.append((wd, sandbox.run("git rev-parse HEAD").output.strip()))
        write_with(sandbox, how, old, new)
    time.sleep(1.1)
    for round, ((wd, commit), (old, _)) in enumerate(zip(repos, edits)):
        sandbox.workdir, sandbox.base_commit = wd, commit
        patch = sandbox.diff()
        assert f"-{'a = 2' if 'a' not in old else 'b = a + 1'}" in patch, (how, round, patch)
        sandbox.reset()
        assert sandbox.read_file("m.py") == b"a = 2\nb = a + 1\n" and sandbox.diff() == ""


@pytest.mark.docker
def test_files_go_through_the_session_as_its_user_in_chunks_under_the_output_cap(base_image):
    """A file bigger than the output cap comes back whole, whatever PATH the session exported; an existing file
    keeps its mode; what the sandbox user may not read or write (root's own files) is refused, to the edit tool
    too, as it is to its shell."""
    from pipeline.agent.tools import execute

    data = bytes(range(256)) * 40  # 10 KB: several chunks under a 2 KB cap
    with DockerSandbox(base_image, workdir="/tmp", config=SandboxSpec(output_cap=2000)) as sb:
        sb.write_file("deep/blob.bin", data)
        assert sb.read_file("/tmp/deep/blob.bin") == data
        shadow = "mkdir -p fake && printf '#!/bin/sh\\necho fake\\n' > fake/base64 && chmod +x fake/base64"
        sb.run(f"{shadow} && cp fake/base64 fake/head && export PATH=/tmp/fake:$PATH")  # a PATH the agent exported
        sb.write_file("deep/blob.bin", data[::-1])
        assert sb.read_file("/tmp/deep/blob.bin") == data[::-1]
        sb.run("printf '#!/bin/sh\\necho one\\n' > run.sh && chmod 0755 run.sh")
        sb.write_file("run.sh", "#!/bin/sh\necho two\n")
        assert sb.run("./run.sh").output == "two\n"
        sb.write_file("empty.txt", b"")
        assert sb.read_file("empty.txt") == b""
        assert sb.run_privileged("install -m 0600 /dev/null /root-only && echo secret > /root-only", 30).exit_code == 0
        with pytest.raises(PermissionError):
            sb.read_file("/root-only")
        with pytest.raises(PermissionError):
            sb.write_file("/root-only", "mine")
        with pytest.raises(IsADirectoryError):
            sb.read_file("deep")
        viewed = execute(sb, "edit", {"command": "view", "path": "/root-only"})
        assert viewed.error and "Permission denied" in viewed.output and "secret" not in viewed.output
        assert sb.run_privileged("cat /root-only", 30).output == "secret\n"


@pytest.mark.docker
def test_no_network_by_default(base_image):
    with DockerSandbox(base_image, workdir="/tmp") as sb:
        result = sb.run("python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=2)\"")
        assert result.exit_code != 0
        assert sb.run("cat /sys/class/net/*/operstate 2>/dev/null; ls /sys/class/net").output.split() == ["unknown", "lo"]


@pytest.mark.docker
def test_fork_bomb_is_contained(base_image):
    config = SandboxSpec(pids=64)
    with DockerSandbox(base_image, workdir="/tmp", config=config) as sb:
        sb.run("bomb() { bomb | bomb & }; bomb", timeout=5)
        # The session survives, or is restarted with the bomb's processes killed: it answers again.
        answers = [sb.run("echo alive", timeout=10).output.strip() for _ in range(3)]
        assert "alive" in answers


@pytest.mark.docker
def test_memory_hog_is_contained(base_image):
    config = SandboxSpec(memory="128m")
    with DockerSandbox(base_image, workdir="/tmp", config=config) as sb:
        result = sb.run("python3 -c \"x = bytearray(512 * 1024 * 1024); print('ALLOC' + 'ATED')\"", timeout=30)
        assert result.exit_code != 0 and "ALLOCATED" not in result.output
        assert sb.run("echo alive").output.strip() == "alive"


@pytest.mark.docker
def test_runs_as_non_root_user(base_image):
    with DockerSandbox(base_image, workdir="/tmp") as sb:
        assert sb.run("whoami").output.strip() == "agent"


@pytest.mark.docker
def test_parallel_sandboxes_do_not_interfere(base_image):
    results, errors, raw = {}, [], {}

    def work(i: int) -> None:
        try:
            with DockerSandbox(base_image, workdir="/tmp") as sb:
                first = sb.run(f"export ME={i}; mkdir -p /tmp/w{i}; cd /tmp/w{i}")
                runs = [sb.run("echo $ME $(pwd)") for _ in range(20)]
                results[i] = {r.output.strip() for r in runs}
                raw[i] = (sb.short_id, first, runs[:2])  # what a failure shows: exit codes, durations, restarts
        except Exception as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert results == {i: {f"{i} /tmp/w{i}"} for i in range(4)}, raw


@pytest.mark.docker
def test_cleanup_after_exception(base_image, docker_client):
    with pytest.raises(ValueError):
        with DockerSandbox(base_image, workdir="/tmp") as sb:
            name = sb.container.id
            raise ValueError("boom")
    assert not docker_client.containers.list(all=True, filters={"id": name})


@pytest.mark.docker
def test_reaper_removes_orphans(base_image, docker_client):
    orphan = docker_client.containers.run(
        base_image, ["sleep", "infinity"], detach=True,
        labels={LABEL: "sandbox", f"{LABEL}.pid": "999999999", f"{LABEL}.host": __import__("socket").gethostname(),
                f"{LABEL}.started": "0"},
    )
    with DockerSandbox(base_image, workdir="/tmp") as live:
        removed = reap(docker_client)
        assert orphan.short_id in removed
        assert live.run("echo still here").output.strip() == "still here"


@pytest.mark.docker
def test_a_container_another_run_removes_first_does_not_stop_the_reaper(base_image, docker_client, monkeypatch):
    labels = {LABEL: "sandbox", f"{LABEL}.pid": "999999999", f"{LABEL}.host": __import__("socket").gethostname(),
              f"{LABEL}.started": "0"}
    orphans = [docker_client.containers.run(base_image, ["sleep", "infinity"], detach=True, labels=labels)
               for _ in range(2)]
    listed = docker_client.api.containers

    def list_then_lose_one(*args, **kwargs):  # another run's reaper removes the first orphan right after the list
        found = listed(*args, **kwargs)
        docker_client.api.remove_container(orphans[0].id, force=True)
        return found

    monkeypatch.setattr(docker_client.api, "containers", list_then_lose_one)
    removed = reap(docker_client)
    assert orphans[1].short_id in removed
    monkeypatch.undo()
    assert not docker_client.containers.list(all=True, filters={"id": orphans[1].id})


def test_output_of_a_background_process_stays_out_of_later_results(sandbox):
    started = sandbox.run("(sleep 0.3; for i in 1 2 3 4 5 6 7 8; do echo LATE$i; sleep 0.25; done) & echo started")
    assert started.output == "started\n"
    assert sandbox.run("sleep 1; echo next").output == "next\n"
    assert sandbox.run("sleep 1; echo last").output == "last\n"


# What a command's shell says of itself: a shell of its own (its $$, its parent the loop, no $! and no loop variable),
# the user it runs as, and whether it is a fork of the loop (its command line is the loop's).
WHO_AM_I = ('echo "$$ $BASHPID $BASH_SUBSHELL [$!] $0 $#"; echo "$UID $EUID $(id -u) $(id -G)"; '
            'echo "$S$M$CAP$USR$FORK$CMD" | wc -c; tr "\\0" " " < /proc/$PPID/cmdline | grep -c handhold-shell; '
            'tr "\\0" " " < /proc/$$/cmdline | grep -c handhold-shell; ps -eo args | grep -c [_]_HANDHOLD_')


def who_am_i(sandbox: Sandbox) -> tuple[bool, list[str], list[str]]:
    """(a fork of the loop, the shell's own ids and name, the user's ids), asserting what holds either way."""
    result = sandbox.run(WHO_AM_I)
    own, ids, loop_vars, parent, forked, markers = result.output.strip("\n").split("\n")
    pid, bashpid, level, bang, name, argc = own.split()
    assert (pid, level, bang, name, argc) == (bashpid, "0", "[]", "bash", "0"), own
    assert (loop_vars, parent) == ("1", "1")  # none of the loop's variables; its parent is the loop
    assert markers == "0", "the session's marker shows on a command line"
    return forked == "1", ids.split()[:3], ids.split()[3:]


def test_a_command_runs_in_a_fork_of_the_loop_as_a_shell_of_its_own(sandbox):
    """The loop forks the command's shell (with `handhold_become`) instead of running a fresh bash: two execs
    fewer. It looks as a fresh one would: its own $$ and parent, none of the loop's variables, the session's
    user through and through (bash's UID and EUID, the process's ids and groups)."""
    forked, (uid, euid, real), groups = who_am_i(sandbox)
    assert forked
    if isinstance(sandbox, DockerSandbox):
        assert (uid, euid, real, groups) == ("1000", "1000", "1000", ["1000"])
        assert sandbox.run("touch /root/x; cat /etc/shadow").exit_code != 0
    assert sandbox.run("export HH=1; cd /").exit_code == 0 and sandbox.run("echo $HH $PWD").output == "1 /\n"


@pytest.mark.parametrize("builtin", ["", "bm90IGFuIEVMRiBmaWxlCg=="], ids=["none", "not-loadable"])
def test_without_the_builtin_a_command_runs_in_a_fresh_shell_as_the_user(base_image, monkeypatch, builtin):
    """No compiler on the host, or a builtin the container cannot load: each command's shell is a fresh bash, through
    setpriv, and nothing else changes."""
    from sandbox import become_builtin

    monkeypatch.setattr(become_builtin, "encoded", lambda: builtin)
    with DockerSandbox(base_image, workdir="/home/agent") as sb:
        forked, ids, groups = who_am_i(sb)
        assert not forked and (ids, groups) == (["1000"] * 3, ["1000"])
        assert sb.run("export HH=1; cd /").exit_code == 0 and sb.run("echo $HH $PWD").output == "1 /\n"


def test_the_builtin_is_built_with_the_hosts_compiler_or_left_out_with_a_warning(monkeypatch, caplog):
    import base64

    from sandbox import become_builtin

    built = base64.b64decode(become_builtin.encoded())
    assert built[:4] == b"\x7fELF" and b"handhold_become_struct" in built
    become_builtin.encoded.cache_clear()
    monkeypatch.setenv("CC", "/nonexistent/cc")
    try:
        assert become_builtin.encoded() == ""
        assert "cannot build the sandbox session's builtin with /nonexistent/cc" in caplog.text
    finally:
        become_builtin.encoded.cache_clear()


@pytest.fixture(scope="module")
def agent_image(base_image, docker_client) -> str:
    """An image whose default user is the sandbox user, as environment images are."""
    from sandbox.images import build_from_dockerfile

    tag = "handhold/test-agent-user:1"
    build_from_dockerfile(docker_client, f"FROM {base_image}\nUSER agent\nWORKDIR /home/agent\n", tag, files={})
    return tag


@pytest.mark.docker
def test_cleaning_tmp_does_not_break_the_session(agent_image):
    with DockerSandbox(agent_image, workdir="/home/agent") as sb:
        sb.run("export KEEP=1; cd /tmp")
        sb.run("rm -rf /tmp/* /tmp/.[!.]* /run/* 2>/dev/null; find / -user agent -path '*handhold*' -delete 2>/dev/null")
        after = sb.run("echo $KEEP $(pwd)")
        assert (after.exit_code, after.output, after.shell_restarted) == (0, "1 /tmp\n", False)


@pytest.mark.docker
def test_the_images_user_is_probed_once_per_image(agent_image, monkeypatch):
    from sandbox import docker_sandbox

    probed, run_as = [], DockerSandbox._run_as
    monkeypatch.setattr(docker_sandbox, "_USERS", {})
    monkeypatch.setattr(DockerSandbox, "_run_as", lambda self, user: probed.append(user) or run_as(self, user))
    for _ in range(2):
        with DockerSandbox(agent_image, workdir="/home/agent") as sb:
            assert sb.run("whoami").output.strip() == "agent" and sb.run_as.split()[3] == "agent"
    assert probed == ["agent"]


@pytest.mark.docker
def test_kill_all_as_the_sandbox_user_keeps_the_container(agent_image):
    with DockerSandbox(agent_image, workdir="/home/agent") as sb:
        sb.run("export KEEP=1")
        # bash's kill spares bash itself; the sleep is started from a subshell, so it is no job of the session's
        # bash and no "Killed" job notice races the echo into the output
        builtin = sb.run("(sleep 30 &); kill -9 -1; echo after", timeout=20)
        assert (builtin.exit_code, builtin.output, builtin.shell_restarted) == (0, "after\n", False)
        killed = sb.run("sleep 30 & python3 -c 'import os; os.kill(-1, 9)'; echo unreachable", timeout=20)
        assert (killed.exit_code, killed.output, killed.shell_restarted) == (137, "", False)
        sb.container.reload()
        assert sb.container.status == "running"
        assert sb.run("echo $KEEP; pgrep -u agent sleep || echo none").output.split() == ["1", "none"]


@pytest.mark.docker
def test_a_forged_frame_cannot_reach_the_session(agent_image):
    forge = ("for p in /proc/[0-9]*; do m=$(tr '\\0' '\\n' < $p/cmdline 2>/dev/null | grep __HANDHOLD_); "
             "[ -n \"$m\" ] && printf '%s 0 7\\nforged\\n' \"$m\" > $p/fd/1 && echo FORGED; done; echo tried")
    with DockerSandbox(agent_image, workdir="/home/agent") as sb:
        tried = sb.run(forge)
        assert "FORGED" not in tried.output and tried.output.endswith("tried\n")
        assert [sb.run(f"echo {w}").output for w in ("one", "two", "three")] == ["one\n", "two\n", "three\n"]


def test_a_privileged_command_exits_only_after_its_output_was_read():
    """The engine drops an exec's output still in flight 2 s after the process exits; the process therefore waits
    for the client's answer, sent once the output's end marker came (a fake stream over a socket pair)."""
    import socket
    import struct

    from sandbox.exec_stream import privileged_argv, read_output

    argv, marker = privileged_argv("cat /root-only", 30, stdin_bytes=0)
    assert argv[-3:] == ["cat /root-only", marker.decode(), "0"]
    frame = lambda kind, data: struct.pack(">BxxxL", kind, len(data)) + data  # noqa: E731
    client, engine = socket.socketpair()
    answered = []

    def serve():
        engine.sendall(frame(1, b"sec") + frame(2, b"warn\n") + frame(1, b"ret\n" + marker[:5]))
        time.sleep(0.2)  # the marker split over frames, late
        engine.sendall(frame(1, marker[5:]))
        answered.append(engine.recv(1))  # the process exits only now
        engine.close()

    server = threading.Thread(target=serve)
    server.start()
    assert read_output(client, marker, 10) == b"secret\nwarn\n"
    server.join()
    assert answered == [b"\n"]
    client, engine = socket.socketpair()  # the process was killed before its marker: what came is kept
    engine.sendall(frame(1, b"partial"))
    engine.close()
    assert read_output(client, marker, 10) == b"partial"


@pytest.mark.docker
@pytest.mark.parametrize("user", ["auto", "root"])  # through the root loop; in an exec of its own
def test_privileged_output_is_exact_and_ends_with_the_command(base_image, user):
    """stdout and stderr in order, bytes kept, no marker left over; a command without input reads nothing, one with
    input reads it to its end; the exit code and a timeout come back as before."""
    with DockerSandbox(base_image, workdir="/tmp", config=SandboxSpec(user=user)) as sb:
        assert bool(sb.run_as) == (user == "auto")
        done = sb.run_privileged("printf 'a\\377b\\n'; echo err >&2; echo out; cat; exit 3", 30)
        assert (done.exit_code, done.output.encode("utf-8", "surrogateescape")) == (3, b"a\xffb\nerr\nout\n")
        fed = sb.run_privileged("cat; echo ' fed'", 30, stdin=b"12345")
        assert (fed.exit_code, fed.output) == (0, "12345 fed\n")
        slow = sb.run_privileged("sleep 30", 1)
        assert slow.timed_out and slow.exit_code == 124 and slow.output == ""


@pytest.mark.docker
def test_a_privileged_command_goes_through_the_session_as_an_exec_would_run_it(base_image, monkeypatch):
    """Through the root loop (no exec once the session runs): root, the environment and cwd an exec gets, every byte
    both ways, the session's own state untouched; its input is on no command line the sandbox user can read."""
    with DockerSandbox(base_image, workdir="/tmp", config=SandboxSpec(user=SANDBOX_USER)) as sb:
        probe = "id -u; pwd; env | grep -v '^_=' | sort; head -c 9 | od -An -c"
        by_exec = sb.run_privileged(probe, 30, stdin=b"a\0b\xffc\n123")
        sb.run("cd /home && export MINE=1", 10)
        monkeypatch.setattr(DockerSandbox, "_privileged_exec", lambda *a: pytest.fail("an exec was made"))
        in_session = sb.run_privileged(probe, 30, stdin=b"a\0b\xffc\n123")
        assert in_session.output == by_exec.output and in_session.output.startswith("0\n/tmp\nHOME=/root\n")
        assert "MINE" not in in_session.output and sb.run("pwd; echo $MINE", 10).output == "/home\n1\n"
        big = sb.run_privileged("head -c 300000 /dev/zero; echo end", 30)  # past the session's output cap
        assert big.output.encode("utf-8", "surrogateescape") == b"\0" * 300000 + b"end\n" and not big.cut_bytes
        secret = "k" + "3y" * 20
        seen = sb.run_privileged("(sleep 1; cat /proc/[0-9]*/cmdline | tr '\\0' ' ') 2>/dev/null | "
                                 f"setpriv --reuid={SANDBOX_USER} --regid={SANDBOX_USER} --init-groups cat; "
                                 "cat > /dev/null", 30, stdin=secret.encode() * 50)
        assert seen.exit_code == 0 and "sleep" in seen.output and secret not in seen.output
        assert base64.encodebytes(secret.encode() * 50).decode()[:60] not in seen.output  # nor as base64


@pytest.mark.docker
def test_a_session_lost_in_a_privileged_command_is_an_error_and_the_session_restarts(base_image):
    with DockerSandbox(base_image, workdir="/tmp", config=SandboxSpec(user=SANDBOX_USER)) as sb:
        sb.run("cd /home", 10)
        with pytest.raises(SandboxError, match="session was lost during a privileged command"):
            sb.run_privileged("pkill -KILL -f '^bash --noprofile --norc -c .*handhold-shell'; sleep 60", 5)
        after = sb.run("echo alive; id -u", 10)
        assert after.output.split()[0] == "alive" and after.output.split()[1] != "0"
        assert sb.run_privileged("id -u", 10).output == "0\n"


@pytest.mark.docker
def test_two_callers_at_once_build_the_base_image_once(base_image, docker_client, monkeypatch):
    """Two commands that need the missing base image at once: the second waits for the first one's build instead
    of starting its own, and finds the image made."""
    from concurrent.futures import ThreadPoolExecutor

    from sandbox import images

    config = images.BaseImageConfig(pull_candidates=(base_image,), tag="handhold/test-base-once:1")
    if images.image_exists(docker_client, config.tag):  # left by an interrupted run
        docker_client.images.remove(config.tag, force=True)
    builds, real = [], images._build_base_image

    def counted(client, cfg):
        builds.append(cfg.tag)
        time.sleep(1)  # the second caller arrives while this one builds
        real(client, cfg)

    monkeypatch.setattr(images, "_build_base_image", counted)
    try:
        with ThreadPoolExecutor(2) as pool:
            tags = list(pool.map(lambda _: images.ensure_base_image(config, docker_client), range(2)))
        assert tags == [config.tag, config.tag] and builds == [config.tag]
        assert docker_client.images.get(config.tag).labels.get(LABEL) == "base"
    finally:
        docker_client.images.remove(config.tag, force=True)
