"""A synthesized task's sandboxes start from its prepared image: made once, holding what `prepare` makes."""

from __future__ import annotations

import uuid

import docker.errors
import pytest

from assets.cli import main
from pipeline.verifier import environment
from pipeline.verifier.environment import prepare, prepared_image, task_sandbox
from sandbox.docker_sandbox import DockerSandbox
from sandbox.images import LABEL, image_exists
from sandbox.prune import prune_derived_images

pytestmark = pytest.mark.docker

# What a task's sandbox holds once ready: the index (every tracked file's blob), the history, a clean status, the
# user and folder commands start in; and root's pristine snapshot the grader restores a used sandbox from.
STATE = "git ls-files -s | md5sum; git log --format=%H | wc -l; git status --porcelain | wc -l; whoami; pwd"
PRISTINE = "cd /run/handhold-private/pristine && md5sum ignored git-config && tar -tf ignored.tar | md5sum && stat -c %a ."


def state(sandbox) -> tuple[str, str]:
    return sandbox.run(STATE).output, sandbox.run_privileged(PRISTINE, 60).output


def test_a_synthesized_tasks_sandbox_starts_from_its_prepared_image(toolz_task, docker_client):
    tag = prepared_image(toolz_task)
    assert tag and prepared_image(toolz_task) == tag  # made once, then found
    image, source = docker_client.images.get(tag), docker_client.images.get(toolz_task.image)
    assert image.labels[LABEL] == "prepared" and image.labels[f"{LABEL}.task"] == toolz_task.instance_id
    assert image.labels[f"{LABEL}.pid"] == "" and image.labels[f"{LABEL}.host"] == ""  # no sandbox's, no reaper's
    assert image.attrs["Config"]["User"] == source.attrs["Config"]["User"]
    assert image.labels[f"{LABEL}.users-of"] == source.id  # its users are its source's, probed once for both
    with DockerSandbox(toolz_task.image, workdir=toolz_task.workdir):
        pass
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(DockerSandbox, "_run_as", lambda *a: pytest.fail("the prepared image's users probed again"))
        with task_sandbox(toolz_task) as sb:
            assert sb.run("id -un").output == "agent\n"
    with task_sandbox(toolz_task) as sb:
        assert sb.image == tag and sb.base_commit == toolz_task.base_commit and sb.diff() == ""
        prepared = state(sb)
    with DockerSandbox(toolz_task.image, workdir=toolz_task.workdir) as sb:  # what each sandbox did before
        prepare(sb, toolz_task)
        sb.run(f"cd {toolz_task.workdir}")
        assert sb.base_commit == toolz_task.base_commit
        made_here = state(sb)
    assert prepared == made_here and prepared[0].split("\n")[1] == "1", prepared  # the bug's commit, alone


def test_a_prepared_image_that_cannot_be_made_leaves_each_sandbox_to_prepare_itself(toolz_task, monkeypatch, caplog):
    def refuse(*args, **kwargs):
        raise docker.errors.APIError("no space left on device")

    monkeypatch.setattr(docker.APIClient, "commit", refuse)
    monkeypatch.setattr(environment, "PREPARED_VERSION", "a version never made")
    assert prepared_image(toolz_task) is None
    assert f"task {toolz_task.instance_id}: its prepared image could not be made" in caplog.text
    with task_sandbox(toolz_task) as sb:
        assert sb.image == toolz_task.image and sb.base_commit == toolz_task.base_commit and sb.diff() == ""


def test_prune_images_removes_the_derived_images_no_container_uses(base_image, docker_client, capsys):
    task_id = f"prune__{uuid.uuid4().hex[:10]}"  # this test's images alone: other workers' stay
    tags = []
    for name in ("unused", "used"):
        maker = docker_client.containers.run(base_image, ["sh", "-c", "head -c 1048576 /dev/urandom > /blob"],
                                             user="root", detach=True)
        maker.wait()
        maker.commit("handhold/prepared", f"{task_id}-{name}", conf={"Labels": {LABEL: "prepared",
                                                                                 f"{LABEL}.task": task_id}})
        maker.remove()
        tags.append(f"handhold/prepared:{task_id}-{name}")
    user = docker_client.containers.create(tags[1], ["true"])  # made, never started: still uses its image
    try:
        assert prune_derived_images(docker_client, older_than_s=3600, task=task_id).removed == []  # too new
        pruned = prune_derived_images(docker_client, task=task_id)
        assert (pruned.removed, pruned.in_use) == ([tags[0]], [tags[1]]) and pruned.freed_bytes >= 2**20
        assert not image_exists(docker_client, tags[0]) and image_exists(docker_client, tags[1])
    finally:
        user.remove()
    assert main(["prune-images", "--task", task_id]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"removed {tags[1]}"
    assert not image_exists(docker_client, tags[1]) and image_exists(docker_client, base_image)
