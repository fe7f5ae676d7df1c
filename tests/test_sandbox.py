"""Behaviour of both sandboxes, against a real Docker engine and real subprocesses."""

from __future__ import annotations

import threading
import time

import pytest

from sandbox import DockerSandbox, DockerSandboxConfig, LocalSandbox, Sandbox, reap
from sandbox.images import LABEL

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
    result = sandbox.run("sleep 100 | cat; echo never", timeout=2)
    elapsed = time.monotonic() - start
    assert result.timed_out and "never" not in result.output
    assert elapsed < 6
    after = sandbox.run("echo $KEEP; pgrep -f 'sleep 100' || echo no-sleep")
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
    sandbox.reset()
    assert sandbox.diff() == ""
    assert sandbox.read_file("f.txt") == b"a\nb\n"
    assert sandbox.run("test -e new.py").exit_code == 1


def test_shell_exit_is_restarted_and_reported(sandbox):
    result = sandbox.run("kill -9 $PPID", timeout=5)
    assert result.shell_restarted
    assert sandbox.run("echo alive").output.strip() == "alive"


@pytest.mark.docker
def test_no_network_by_default(base_image):
    with DockerSandbox(base_image, workdir="/tmp") as sb:
        result = sb.run("python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=2)\"")
        assert result.exit_code != 0
        assert sb.run("cat /sys/class/net/*/operstate 2>/dev/null; ls /sys/class/net").output.split() == ["unknown", "lo"]


@pytest.mark.docker
def test_fork_bomb_is_contained(base_image):
    config = DockerSandboxConfig(pids=64)
    with DockerSandbox(base_image, workdir="/tmp", config=config) as sb:
        sb.run("bomb() { bomb | bomb & }; bomb", timeout=5)
        # The session survives, or is restarted with the bomb's processes killed: it answers again.
        answers = [sb.run("echo alive", timeout=10).output.strip() for _ in range(3)]
        assert "alive" in answers


@pytest.mark.docker
def test_memory_hog_is_contained(base_image):
    config = DockerSandboxConfig(memory="128m")
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
    results, errors = {}, []

    def work(i: int) -> None:
        try:
            with DockerSandbox(base_image, workdir="/tmp") as sb:
                sb.run(f"export ME={i}; mkdir -p /tmp/w{i}; cd /tmp/w{i}")
                outs = [sb.run("echo $ME $(pwd)").output.strip() for _ in range(20)]
                results[i] = set(outs)
        except Exception as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert results == {i: {f"{i} /tmp/w{i}"} for i in range(4)}


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
