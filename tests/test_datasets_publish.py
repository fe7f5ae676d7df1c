"""Export a dataset folder, scan it for secrets, publish it to a loopback Hub over real HTTP."""

from __future__ import annotations

import json
import logging
import random
import string
import struct
import traceback
import zlib
from pathlib import Path

import huggingface_hub.constants
import polars as pl
import pyarrow as pa
import pytest
import yaml

from pipeline.datasets.card import CardInfo, SourcePackage, pass_rates, recovery_rates
from pipeline.datasets.export import CONFIGS, export_dataset
from pipeline.datasets.publish import PublishConfig, PublishError, SecretsFound, publish_dataset
from pipeline.datasets.secrets import find_secrets, scan_table
from tests.hub_loopback import HubServer

RUN = "batch-2026-11-30-a"
TOKEN = "hf_" + "".join(random.Random(7).choices(string.ascii_letters, k=34))  # made up, built at run time


def _chat(*pairs: tuple[str, str]) -> list[dict]:
    return [{"role": role, "content": content} for role, content in pairs]


def _tables(planted: str = "") -> dict:
    """Small tables in the shapes the pipeline builds; `planted` goes into dpo/train row 1's chosen reply."""
    prompt = _chat(("system", "You fix bugs."), ("user", "toolz.groupby drops keys; fix it."))
    dpo = pl.DataFrame({"prompt": [prompt] * 3,
                        "chosen": [_chat(("assistant", "I changed groupby.")),
                                   _chat(("assistant", f"Patched it. {planted}")), _chat(("assistant", "Fixed."))],
                        "rejected": [_chat(("assistant", "Cannot reproduce."))] * 3,
                        "instance_id": ["toolz-1", "toolz-2", "toolz-3"],
                        "chosen_source": ["guided:plan", "unguided", "guided:action"]})
    actguide = pl.DataFrame({"prompt": [prompt] * 2, "k": [2, 5], "K": [4, 5], "instance_id": ["toolz-1", "toolz-3"]})
    sft = pl.DataFrame({"messages": [prompt + _chat(("assistant", "done"))] * 2,
                        "source": ["guided:plan", "guided:hindsight"]})
    trajectories = pl.DataFrame({
        "instance_id": ["a", "a", "a", "b", "b", "c", "c", "d"],
        "guidance_kind": ["none", "plan", "action", "none", "plan", "none", "action", "none"],
        "resolved": [False, True, False, False, False, True, True, False],
        "infra_error": ["", "", "", "", "", "", "", "sandbox died"],
        "steps": [[{"tool": "bash", "output": "1 passed"}]] * 8,
        "split": ["train"] * 5 + ["test"] * 3,
    })
    tasks = pl.DataFrame({
        "instance_id": ["a", "b", "c"],
        "provenance": [json.dumps({"package": "toolz", "version": "1.0.0", "licence": "BSD-3-Clause"}),
                       json.dumps({"package": "tabulate", "version": "0.9.0"}),
                       json.dumps({"dataset": "SWE-bench/SWE-bench", "split": "test", "index": 4})],
    })
    return {"dpo": {"train": dpo, "test": dpo.head(1)}, "actguide": {"train": actguide, "test": actguide.head(1)},
            "sft": {"train": sft, "test": sft.head(1)}, "trajectories": trajectories, "tasks": tasks.to_arrow()}


PLANS = pl.DataFrame({"K": [10, 10, 4, -1, 8, 5], "k_star": [3, 10, -1, -1, 0, 2],
                      "accepted": [True, True, True, True, True, False]})
CARD = CardInfo(pretty_name="handhold test", run_id=RUN, repo_id="handhold/test-data")


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    export_dataset(tmp_path / "export", _tables(), CARD, PLANS)
    return tmp_path / "export"


def _log_everything(caplog, monkeypatch) -> None:
    """Capture every logger at DEBUG, huggingface_hub's curl lines (HF_DEBUG) included."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_DEBUG", True)
    for name in (None, "huggingface_hub", "httpx2", "httpcore2", "pipeline"):
        caplog.set_level(logging.DEBUG, logger=name)


def _header(folder: Path) -> dict:
    return yaml.safe_load((folder / "README.md").read_text().split("---\n")[1])


# --- export -------------------------------------------------------------------------------

def test_every_config_loads_offline_with_its_splits_and_rows(folder, tmp_path, monkeypatch):
    import datasets

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # both read the variables at import
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    expected = {"dpo": {"train": 3, "test": 1}, "actguide": {"train": 2, "test": 1}, "sft": {"train": 2, "test": 1},
                "trajectories": {"train": 5, "test": 3}, "tasks": {"train": 3}}
    for config in CONFIGS:
        loaded = datasets.load_dataset(str(folder), config, cache_dir=str(tmp_path / "cache"))
        assert {split: ds.num_rows for split, ds in loaded.items()} == expected[config]
    dpo = datasets.load_dataset(str(folder), "dpo", split="train", cache_dir=str(tmp_path / "cache"))
    assert dpo[1]["prompt"][1] == {"role": "user", "content": "toolz.groupby drops keys; fix it."}
    assert dpo[0]["chosen"][0]["content"] == "I changed groupby."


def test_layout_and_card_header_list_every_config(folder):
    header = _header(folder)
    assert [c["config_name"] for c in header["configs"]] == list(CONFIGS)
    for config in header["configs"]:
        for entry in config["data_files"]:
            assert list(folder.glob(entry["path"])) == [folder / f"data/{config['config_name']}/"
                                                        f"{entry['split']}-00000-of-00001.parquet"]
    assert header["configs"][0]["default"] is True and header["pretty_name"] == "handhold test"
    assert (folder / "k_star_histogram.png").is_file()


def test_card_states_counts_rates_sources_and_loading(folder):
    card = (folder / "README.md").read_text()
    assert f"run `{RUN}`" in card
    assert "| trajectories | test | 3 |" in card and "| tasks | train | 3 |" in card
    assert "| plan | 2 | 1 | 50.0% | 2 | 1 |" in card  # attempts, resolved, rate, tasks, tasks resolved
    assert "| any | 2 | 1 | 50.0% |" in card  # a and b failed unguided; a was recovered
    assert "| toolz | 1.0.0 | BSD-3-Clause | https://pypi.org/project/toolz/1.0.0/ |" in card
    assert "| tabulate | 0.9.0 | unknown |" in card and "| SWE-bench/SWE-bench |  | unknown |" in card
    assert 'load_dataset("handhold/test-data", "dpo")' in card
    assert "![k*/K histogram](k_star_histogram.png)" in card and "| 0.3-0.4 | 1 |" in card
    assert "Plans where no prefix succeeded: 1." in card  # the unaccepted plan is left out
    assert "| chosen from | dpo pairs | sft rows |" in card  # train and test together
    assert "| guided:action | 1 | 0 |" in card and "| guided:hindsight | 0 | 1 |" in card
    assert "| guided:plan | 2 | 2 |" in card and "| unguided | 1 | 0 |" in card


def test_given_sources_keep_their_licence_or_take_the_provenance_one(tmp_path):
    card = CardInfo("t", RUN, sources=(SourcePackage("toolz", "1.0.0", url="https://x"),
                                       SourcePackage("boltons", "25.0.0", "BSD-3-Clause")))
    export_dataset(tmp_path / "out", _tables(), card)
    text = (tmp_path / "out" / "README.md").read_text()
    assert "| toolz | 1.0.0 | BSD-3-Clause | https://x |" in text and "| boltons | 25.0.0 | BSD-3-Clause |" in text
    assert "tabulate" not in text and not (tmp_path / "out" / "k_star_histogram.png").exists()


def test_pass_and_recovery_rates_leave_out_infra_errors():
    trajectories = _tables()["trajectories"]
    passes = {row["guidance_kind"]: row for row in pass_rates(trajectories).to_dicts()}
    assert passes["none"] == {"guidance_kind": "none", "attempts": 3, "resolved": 1, "pass_rate": pytest.approx(1 / 3),
                              "tasks": 3, "tasks_resolved": 1}
    recovery = {row["guidance_kind"]: row for row in recovery_rates(trajectories).to_dicts()}
    assert (recovery["plan"]["failed_unguided"], recovery["plan"]["recovered"]) == (2, 1)
    assert (recovery["action"]["failed_unguided"], recovery["action"]["recovered"]) == (1, 0)
    assert list(recovery) == ["action", "plan", "any"]


def test_histogram_is_a_valid_png(folder):
    data = (folder / "k_star_histogram.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    at, chunks = 8, {}
    while at < len(data):
        (length,) = struct.unpack(">I", data[at:at + 4])
        tag, body = data[at + 4:at + 8], data[at + 8:at + 8 + length]
        assert struct.unpack(">I", data[at + 8 + length:at + 12 + length])[0] == zlib.crc32(tag + body)
        chunks[tag] = body
        at += 12 + length
    width, height, depth, colour = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert (depth, colour) == (8, 2) and list(chunks)[-1] == b"IEND"
    assert len(zlib.decompress(chunks[b"IDAT"])) == height * (1 + 3 * width)


def test_export_replaces_the_old_folder_whole(tmp_path):
    export_dataset(tmp_path / "out", _tables(), CARD, PLANS)
    report = export_dataset(tmp_path / "out", {"sft": _tables()["sft"]}, CARD)
    assert report.files == ("README.md", "data/sft/test-00000-of-00001.parquet",
                            "data/sft/train-00000-of-00001.parquet")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging or old copy left behind
    assert report.rows == {"sft": {"train": 2, "test": 1}} and report.total_rows == 3


@pytest.mark.parametrize("tables, message", [
    ({"dpo_v2": pl.DataFrame({"a": [1]})}, "unknown dataset configs"),
    ({"sft": {"train-1": pl.DataFrame({"a": [1]})}}, "split names"),
    ({"sft": {"train": pl.DataFrame({"a": []})}}, "every table given is empty"),
])
def test_export_names_what_to_fix(tmp_path, tables, message):
    with pytest.raises(ValueError, match=message):
        export_dataset(tmp_path / "out", tables, CARD)
    assert not (tmp_path / "out").exists()


# --- secret scan --------------------------------------------------------------------------

def _random(alphabet: str, n: int, seed: int = 1) -> str:
    return "".join(random.Random(seed).choices(alphabet, k=n))


ALNUM = string.ascii_letters + string.digits
PLANTED = {  # pattern -> (text with the secret, the secret's body that must never be shown)
    "openai_key": ("client = OpenAI(api_key='sk-proj-{s}')", _random(ALNUM + "_-", 48)),
    "anthropic_key": ("ANTHROPIC_API_KEY=sk-ant-api03-{s}", _random(ALNUM, 40)),
    "huggingface_token": ("huggingface-cli login --token hf_{s}", _random(string.ascii_letters, 34)),
    "github_token": ("git clone https://x:ghp_{s}@github.com/o/r", _random(ALNUM, 36)),
    "aws_access_key": ("aws_access_key_id = AKIA{s}", _random(string.ascii_uppercase + string.digits, 16)),
    "slack_token": ("SLACK: xoxb-{s}", "123456789012-" + _random(ALNUM, 24)),
    "bearer_token": ("curl -H 'Authorization: Bearer {s}' https://api", "eyJhbGciOiJIUzI1NiJ9." + _random(ALNUM, 30)),
    "private_key": ("key = '''-----BEGIN OPENSSH PRIVATE KEY-----\n{s}\n-----END OPENSSH PRIVATE KEY-----'''",
                    _random(ALNUM + "+/", 64)),
    "env_assignment": ("export DATABASE_SECRET={s}", _random(ALNUM, 24)),
}
EXTRA = {  # more shapes of the same patterns: name -> (pattern, text, secret)
    "yaml_token": ("env_assignment", "auth:\n  TOKEN: {s}\n", _random(ALNUM, 20, seed=3)),
    "quoted_password": ("env_assignment", 'db.connect(user="ci", password="{s}")', _random(ALNUM, 20, seed=4)),
    "json_escaped_key": ("private_key",
                         '{{"content": "-----BEGIN RSA PRIVATE KEY-----\\n{s}\\n-----END RSA PRIVATE KEY-----"}}',
                         _random(ALNUM + "+/", 64, seed=5)),
    "github_pat": ("github_token", "GH=github_pat_{s}", _random(ALNUM, 22) + "_" + _random(ALNUM, 59, seed=6)),
    "openai_legacy": ("openai_key", "key: sk-{s}", _random(ALNUM, 48, seed=8)),
}
PLANTED.update({name: (text, secret) for name, (_, text, secret) in EXTRA.items()})


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_planted_secret_is_caught_and_never_shown(name):
    template, secret = PLANTED[name]
    text = template.format(s=secret)
    spans = find_secrets(text)
    assert [s[0] for s in spans] == [EXTRA[name][0] if name in EXTRA else name]
    table = pa.table({"messages": [[{"role": "user", "content": "hi"}], [{"role": "tool", "content": text}]]})
    [finding] = scan_table(table, "sft", "train")
    assert (finding.config, finding.split, finding.row, finding.column) == ("sft", "train", 1, "messages[].content")
    assert secret not in finding.describe() and secret[-12:] not in finding.excerpt
    assert "[REDACTED" in finding.excerpt


CLEAN = [
    'def load(path: str, key: str = "default") -> dict:\n    token = tokenizer.encode(text)\n'
    '    headers = {"Authorization": f"Bearer {token}"}\n    api_key = os.environ["OPENAI_API_KEY"]\n'
    '    return sorted(items, key=operator.itemgetter(1))',
    "diff --git a/toolz/itertoolz.py b/toolz/itertoolz.py\nindex 3f2a9c1..8b7e6d4 100644\n--- a/toolz/itertoolz.py\n"
    "+++ b/toolz/itertoolz.py\n@@ -10,7 +10,7 @@ def groupby(key, seq):\n"
    "-    d = collections.defaultdict(lambda: seq.__class__().append)\n"
    "+    d = collections.defaultdict(lambda: [].append)",
    "platform linux -- Python 3.11.7, pytest-8.3.2, pluggy-1.5.0\nrootdir: /testbed\ncollected 4 items\n\n"
    "toolz/tests/test_itertoolz.py ..F.   [100%]\nFAILED toolz/tests/test_itertoolz.py::test_groupby_key - "
    "AssertionError: assert {1: [1]} == {1: [1, 3]}\n==== 1 failed, 3 passed in 0.12s ====",
    "base_commit: 9f1e2d3c4b5a69788796a5b4c3d2e1f0a9b8c7d6\ncommit e83c5163316f89bfbde7d9ab23ca2e25604af290\n"
    "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    '{"rollout_id": "3f9c1e2a-7b4d-4e8f-9a1b-2c3d4e5f6a7b", "group_id": "123e4567-e89b-12d3-a456-426614174000"}',
    'PAYLOAD = base64.b64decode("SGVsbG8sIFdvcmxkISBUaGlzIGlzIGEgdGVzdCBwYXlsb2FkLg==")\n'
    'assert encode(b"\\x00\\xff") == "AP8="\nexpected = "dGhlIHF1aWNrIGJyb3duIGZveCBqdW1wcyBvdmVyIHRoZSBsYXp5IGRvZw=="',
    "PYTHONHASHSEED=0 TOKENIZERS_PARALLELISM=false MAX_TOKENS: 4096 HF_TOKEN=${HF_TOKEN} password_hash = make_hash(x)",
    'if key.startswith("sk-"):\n    hf_hub_download(repo_id="org/model", filename="config.json")\n'
    "task-0123456789abcdef0123456789abcdef01 -----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIU\n",
    'api_key=dg.EnvVar("ANTHROPIC_API_KEY"), token: str = "", secret_name = "prod-db-credentials"',
    '_SK_START = b"-----BEGIN OPENSSH PRIVATE KEY-----"\nmin_key = self.G2_node_order.__getitem__\n'
    'key = "lin0.base_layer.weight2"\ncross_attn_image_to_token = Sam3TrackerAttention(config)',
]


@pytest.mark.parametrize("text", CLEAN, ids=["code", "diff", "pytest", "hashes", "uuids", "base64", "env", "names",
                                             "config", "identifiers"])
def test_clean_text_passes(text):
    assert find_secrets(text) == []


# --- publish ------------------------------------------------------------------------------

def test_publish_creates_private_repo_and_one_commit_on_the_revision(folder, online, caplog, monkeypatch):
    _log_everything(caplog, monkeypatch)
    server = HubServer(token=TOKEN)
    with server as endpoint:
        result = publish_dataset(folder, PublishConfig("handhold/test-data", revision="runs", endpoint=endpoint),
                                 RUN, TOKEN)
    assert server.routes() == ["create_repo", "branch", "validate_yaml", "preupload", "commit"]
    assert not server.unhandled
    repo = server.repo("handhold/test-data")
    assert repo.private and json.loads(server.requests[0].body)["visibility"] == "private"
    [initial, commit] = repo.commits("runs")
    assert RUN in commit.summary and commit.oid == result.commit_oid and repo.commits("main") == [initial]
    on_disk = {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    assert sorted(commit.added) == sorted(on_disk) == [f.path for f in result.files]
    assert {path: repo.files("runs")[path] for path in on_disk} == on_disk
    assert all(r.headers["authorization"] == f"Bearer {TOKEN}" for r in server.requests)
    assert not any(TOKEN.encode() in r.body for r in server.requests)
    assert not any(TOKEN.encode() in data for data in on_disk.values())
    assert "handhold/test-data" in caplog.text and "curl -X POST" in caplog.text  # the logs were captured
    assert TOKEN not in caplog.text


def test_publishing_again_to_main_reuses_the_repo(folder, online):
    server = HubServer(token=TOKEN)
    with server as endpoint:
        config = PublishConfig("handhold/test-data", endpoint=endpoint)
        publish_dataset(folder, config, RUN, TOKEN)
        publish_dataset(folder, config, "batch-2", TOKEN)
    assert [r.status for r in server.requests if r.route == "create_repo"] == [200, 409]
    assert "branch" not in server.routes()
    assert [c.summary for c in server.repo("handhold/test-data").commits()][1:] == [
        f"Publish dataset from handhold run {RUN}", "Publish dataset from handhold run batch-2"]


def test_a_token_that_may_not_create_repos_still_publishes_to_an_existing_one(folder, online, monkeypatch):
    server = HubServer(token=TOKEN, fail_at=2, fail_route="create_repo", fail_status=403)
    with server as endpoint:
        # endpoint '' is the default Hub; huggingface_hub's 403 fallback only works there (it builds the
        # repo URL from the default endpoint, and refuses any other host)
        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", endpoint)
        config = PublishConfig("handhold/test-data")
        publish_dataset(folder, config, RUN, TOKEN)
        publish_dataset(folder, config, "batch-2", TOKEN)
    assert server.routes()[4:] == ["create_repo", "repo_info", "validate_yaml", "preupload", "commit"]
    assert not server.unhandled and len(server.repo("handhold/test-data").commits()) == 3


def test_server_error_on_the_commit_names_repo_and_revision_and_a_rerun_succeeds(folder, online, caplog,
                                                                                monkeypatch):
    _log_everything(caplog, monkeypatch)
    server = HubServer(token=TOKEN, fail_at=1, fail_route="commit")
    with server as endpoint:
        config = PublishConfig("handhold/test-data", revision="runs", endpoint=endpoint)
        with pytest.raises(PublishError) as raised:
            publish_dataset(folder, config, RUN, TOKEN)
        assert len(server.repo("handhold/test-data").commits("runs")) == 1  # only the branch's start
        publish_dataset(folder, config, RUN, TOKEN)
    error = raised.value
    assert "handhold/test-data" in str(error) and "revision runs" in str(error) and "HTTP 500" in str(error)
    assert error.__cause__ is None and error.__context__ is None  # nothing holding the request's headers
    shown = "".join(traceback.format_exception(error)) + repr(error) + caplog.text
    assert TOKEN not in shown
    assert len(server.repo("handhold/test-data").commits("runs")) == 2


def test_a_rejected_token_is_not_repeated_in_the_error(folder, online):
    wrong = "hf_" + "Z" * 34
    with HubServer(token=TOKEN) as endpoint:
        with pytest.raises(PublishError, match="create_repo.*HTTP 401") as raised:
            publish_dataset(folder, PublishConfig("handhold/test-data", endpoint=endpoint), RUN, wrong)
    assert wrong not in "".join(traceback.format_exception(raised.value))


def test_dry_run_lists_what_would_be_pushed_without_any_request(folder, online):
    server = HubServer(token=TOKEN)
    with server as endpoint:
        result = publish_dataset(folder, PublishConfig("handhold/test-data", endpoint=endpoint, dry_run=True), RUN)
    assert server.requests == []
    assert result.dry_run and result.private and result.revision == "main" and result.commit_oid == ""
    assert {f.path: f.size for f in result.files} == {
        p.relative_to(folder).as_posix(): p.stat().st_size for p in folder.rglob("*") if p.is_file()}
    assert "would push 11 files" in result.describe() and "data/dpo/train-00000-of-00001.parquet" in result.describe()


def test_publishing_refuses_a_folder_with_a_secret_and_names_the_row(tmp_path, online):
    template, secret = PLANTED["anthropic_key"]
    export_dataset(tmp_path / "out", _tables(planted=template.format(s=secret)), CARD)
    server = HubServer(token=TOKEN)
    with server as endpoint:
        with pytest.raises(SecretsFound) as raised:
            publish_dataset(tmp_path / "out", PublishConfig("handhold/test-data", endpoint=endpoint), RUN, TOKEN)
    assert server.requests == []
    assert "dpo/train row 1 column chosen[].content: anthropic_key" in str(raised.value)
    assert secret not in str(raised.value)
    assert [(f.config, f.split, f.row) for f in raised.value.findings] == [("dpo", "train", 1)]


@pytest.mark.parametrize("config, token, message", [
    (PublishConfig("no-owner"), TOKEN, "not 'owner/name'"),
    (PublishConfig("o/n", revision="refs/pr/1"), TOKEN, "not a branch name"),
    (PublishConfig("o/n"), "", "needs a Hub write token"),
])
def test_publish_config_errors_say_what_to_change(folder, config, token, message):
    with pytest.raises(PublishError, match=message):
        publish_dataset(folder, config, RUN, token)
