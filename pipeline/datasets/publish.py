"""Publish an exported dataset folder to the Hugging Face Hub as one commit.

The token is the caller's (from `HF_TOKEN`, or a Dagster `EnvVar` upstream). It travels in the
Authorization header of each request and nowhere else: it is not written to the folder, logged,
or put in an exception. huggingface_hub's own errors carry the response, whose request carries
the header, so every failure is turned into a `PublishError` built from text alone, raised
outside the `except` block so it holds no reference to the original.

A folder is refused when the secret scan finds anything in what would be uploaded.

A folder holding a `release.json` (pipeline/datasets/release.py) is a release: its commit is tagged with the
release's name, so `load_dataset(repo, config, revision=<name>)` reads it as it was. A release whose tag is
on the Hub already is not pushed again: no new commit, and the result and the log say so.
"""

from __future__ import annotations

import logging
import re
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi
from huggingface_hub.errors import EntryNotFoundError

from pipeline.datasets.release import RELEASE_FILE, Release
from pipeline.datasets.secrets import SecretFinding, scan_folder

log = logging.getLogger(__name__)

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
BRANCH = re.compile(r"^(?!refs/)(?!.*\.\.)[\w.\-/]+$")
FINDINGS_SHOWN = 10  # findings listed in a refusal; the rest are counted


@dataclass(frozen=True)
class PublishConfig:
    """Where and how an exported folder is published."""

    repo_id: str = ""
    """Hub dataset repo, 'owner/name'; '' publishes nothing (the hub_publication asset says it skipped)."""
    private: bool = True
    """Create the repo private; an existing repo keeps the visibility it has."""
    revision: str = "main"
    """Branch the commit goes to; created from main when missing."""
    endpoint: str = ""
    """Hub base URL; '' means the default Hub (huggingface_hub's HF_ENDPOINT, else huggingface.co)."""
    dry_run: bool = False
    """List what would be pushed and stop, without any network call."""


@dataclass(frozen=True)
class PlannedFile:
    """A file of the folder as it is (or would be) uploaded."""

    path: str
    """Path in the repo, '/'-separated."""
    size: int  # bytes


@dataclass(frozen=True)
class PublishResult:
    """What was pushed (or, for a dry run, what would be)."""

    repo_id: str
    revision: str
    private: bool
    dry_run: bool
    commit_message: str
    files: tuple[PlannedFile, ...]
    commit_oid: str = ""
    """'' for a dry run."""
    commit_url: str = ""
    tag: str = ""
    """The release's tag; '' for a folder that is no release."""
    unchanged: bool = False
    """The release's tag was on the Hub already: nothing was pushed, `commit_oid` is the tagged commit."""

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def describe(self) -> str:
        """A few lines naming the repo, revision, visibility and every file with its size."""
        if self.unchanged:
            return (f"release {self.tag} is on dataset {self.repo_id} already (commit {self.commit_oid}): "
                    "identical content, no new commit")
        head = (f"{'would push' if self.dry_run else 'pushed'} {len(self.files)} files ({self.total_bytes} bytes) "
                f"to dataset {self.repo_id} at revision {self.revision} (private={self.private})")
        return "\n".join([head] + [f"  {f.path}  {f.size} bytes" for f in self.files])


class PublishError(RuntimeError):
    """Publishing failed; the message names the repo, the revision and the step, never the token."""


class SecretsFound(PublishError):
    """The folder holds secrets; `findings` names each (with the secret redacted)."""

    def __init__(self, message: str, findings: list[SecretFinding]):
        super().__init__(message)
        self.findings = findings


def commit_message(run_id: str) -> str:
    """The commit's summary: names the pipeline run the data comes from."""
    return f"Publish dataset from handhold run {run_id}"


def plan_publish(folder: Path, config: PublishConfig, run_id: str) -> PublishResult:
    """What publishing `folder` would push; validates the config and refuses a folder with secrets."""
    folder = Path(folder)
    _validate(folder, config, run_id)
    files = tuple(PlannedFile(p.relative_to(folder).as_posix(), p.stat().st_size) for p in _files(folder))
    findings = scan_folder(folder)
    if findings:
        listed = "\n".join(f"  {f.describe()}" for f in findings[:FINDINGS_SHOWN])
        more = f"\n  ... and {len(findings) - FINDINGS_SHOWN} more" if len(findings) > FINDINGS_SHOWN else ""
        raise SecretsFound(f"refusing to publish {folder} to dataset {config.repo_id}: the secret scan found "
                           f"{len(findings)} secret(s); remove them from the rows and export again:\n{listed}{more}",
                           findings)
    tag = Release.read(folder).name if (folder / RELEASE_FILE).exists() else ""
    return PublishResult(repo_id=config.repo_id, revision=config.revision, private=config.private,
                         dry_run=config.dry_run, commit_message=commit_message(run_id), files=files, tag=tag)


def publish_dataset(folder: Path, config: PublishConfig, run_id: str, token: str = "") -> PublishResult:
    """Push `folder` to the Hub as one commit (or, with dry_run, only say what would be pushed)."""
    folder = Path(folder)
    plan = plan_publish(folder, config, run_id)
    if config.dry_run:
        log.info("dry run: %s", plan.describe())
        return plan
    if not token or token != token.strip() or any(c.isspace() for c in token):
        raise PublishError(f"publishing to dataset {config.repo_id} needs a Hub write token without whitespace: "
                           "pass the value of HF_TOKEN (or the Dagster EnvVar holding it)")
    log.info("publishing %d files (%d bytes) to dataset %s at revision %s (private=%s), run %s",
             len(plan.files), plan.total_bytes, config.repo_id, config.revision, config.private, run_id)
    oid, url, step, failure, tagged, clash = "", "", "create_repo", "", "", False
    api = HfApi(endpoint=config.endpoint or None, token=token, library_name="handhold")
    try:
        api.create_repo(config.repo_id, repo_type="dataset", private=config.private, exist_ok=True)
        if plan.tag:
            step = "list_repo_refs"
            tagged = next((t.target_commit for t in api.list_repo_refs(config.repo_id, repo_type="dataset").tags
                           if t.name == plan.tag), "")
        if tagged:
            step = "read the tagged release.json"
            clash = _tagged_rows(api, config.repo_id, plan.tag) != Release.read(folder).content_sha256
        if not tagged and config.revision != "main":
            step = "create_branch"
            api.create_branch(config.repo_id, branch=config.revision, repo_type="dataset", exist_ok=True)
        if not tagged:
            step = "commit"
            oid, url = _commit(api, folder, config, plan, run_id)
        if plan.tag and not tagged:
            step = "create_tag"
            api.create_tag(config.repo_id, tag=plan.tag, revision=oid, repo_type="dataset",
                           tag_message=f"Release {plan.tag}, from pipeline run {run_id}.")
    except Exception as error:  # noqa: BLE001 -- any error may carry the request and its Authorization header
        failure = _describe(error, token)
    if failure:
        landed = (f"the commit {oid} landed but not the tag {plan.tag}" if step == "create_tag" else
                  "the upload is a single commit, so none of this run's files landed")
        raise PublishError(
            f"publishing {folder} to dataset {config.repo_id} at revision {config.revision} failed at {step}: "
            f"{failure}. {landed[0].upper() + landed[1:]}; fix the cause and publish again.")
    if tagged and clash:
        raise PublishError(f"dataset {config.repo_id} has a tag {plan.tag} holding other rows than {folder}: a "
                           f"release of that name was published from another data folder; delete the Hub tag "
                           f"(HfApi().delete_tag) or publish from the folder that made it")
    if tagged:
        result = replace(plan, commit_oid=tagged, unchanged=True)
        log.info("%s", result.describe())
        return result
    log.info("published %s at revision %s: commit %s%s", config.repo_id, config.revision, oid,
             f", tagged {plan.tag}" if plan.tag else "")
    return replace(plan, commit_oid=oid, commit_url=url)


def _commit(api: HfApi, folder: Path, config: PublishConfig, plan: PublishResult, run_id: str) -> tuple[str, str]:
    """One commit of the folder's files; a release's commit also deletes what the revision holds beyond them, so
    its tag's tree is the folder (a config or split the release lacks does not linger from an older one)."""
    operations: list = [CommitOperationAdd(f.path, folder / f.path) for f in plan.files]
    if plan.tag:
        ours = {f.path for f in plan.files} | {".gitattributes"}
        held = api.list_repo_files(config.repo_id, repo_type="dataset", revision=config.revision)
        operations += [CommitOperationDelete(path) for path in held if path not in ours]
    info = api.create_commit(
        config.repo_id, repo_type="dataset", revision=config.revision, operations=operations,
        commit_message=plan.commit_message,
        commit_description=f"{len(plan.files)} files, {plan.total_bytes} bytes, from pipeline run {run_id}.")
    return info.oid, info.commit_url


def _tagged_rows(api: HfApi, repo_id: str, tag: str) -> str:
    """The rows digest of the release the Hub holds under `tag` ('' when it has no release.json)."""
    with tempfile.TemporaryDirectory() as cache:
        try:
            path = api.hf_hub_download(repo_id, RELEASE_FILE, repo_type="dataset", revision=tag, cache_dir=cache)
        except EntryNotFoundError:
            return ""
        return Release.read(Path(path).parent).content_sha256


def _validate(folder: Path, config: PublishConfig, run_id: str) -> None:
    if not REPO_ID.match(config.repo_id):
        raise PublishError(f"PublishConfig.repo_id {config.repo_id!r} is not 'owner/name'")
    if not BRANCH.match(config.revision):
        raise PublishError(f"PublishConfig.revision {config.revision!r} is not a branch name (no refs/, no '..')")
    if not run_id.strip():
        raise PublishError("run_id is empty: the commit message must name the pipeline run")
    if not (folder / "README.md").is_file():
        raise PublishError(f"{folder} has no README.md: publish a folder written by export_dataset")


def _files(folder: Path) -> list[Path]:
    """Every file to upload, sorted; hidden paths (caches, editor files) are not part of an export."""
    return sorted(p for p in folder.rglob("*")
                  if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts))


def _describe(error: Exception, token: str) -> str:
    """The error as one line of text: its type, HTTP status and server message; the token scrubbed."""
    response = getattr(error, "response", None)
    status = f" (HTTP {response.status_code})" if getattr(response, "status_code", None) else ""
    text = " ".join(str(error).split())[:600] or "no message"
    return f"{type(error).__name__}{status}: {text}".replace(token, "[token]")
