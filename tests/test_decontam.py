"""Decontamination: repositories of evaluation benchmarks flagged or set aside, for dataset and synthesized tasks."""

import json
import logging

import pytest

from pipeline.core.records import Task
from pipeline.sources.harness_specs import spec_repos
from pipeline.tasks.decontam import benchmark_repos, decontaminate, overlapping_benchmarks, repo_key

VERIFIED = {
    "astropy/astropy", "django/django", "matplotlib/matplotlib", "mwaskom/seaborn", "pallets/flask", "psf/requests",
    "pydata/xarray", "pylint-dev/pylint", "pytest-dev/pytest", "scikit-learn/scikit-learn", "sphinx-doc/sphinx",
    "sympy/sympy",
}


def synthesized(package: str) -> Task:
    """A task shaped as pipeline.synthesis.synth.make_task writes it: repo 'pypi/<package>'."""
    provenance = {"package": package, "version": "1.0", "kind": "invert_if", "candidate_id": "c0ffee"}
    return Task(instance_id=f"{package}__1.0__invert_if__c0ffee", repo=f"pypi/{package}", base_commit="",
                patch="", test_patch="", problem_statement="x", FAIL_TO_PASS=("tests/test_a.py::test_a",),
                PASS_TO_PASS=(), image=f"handhold-env/{package}:1.0", workdir="/testbed", test_cmd="pytest -rA",
                log_parser="parse_log_pytest", source="synth", provenance=json.dumps(provenance))


def test_the_shipped_verified_list_is_its_twelve_repositories():
    assert benchmark_repos("swe-bench-verified") == {repo_key(repo) for repo in VERIFIED}
    assert VERIFIED <= spec_repos()  # every one is a repository swebench's harness has specs for


@pytest.mark.parametrize("repo,key", [
    ("psf/requests", "requests"),
    ("pypi/requests", "requests"),
    ("swesmith/pallets__markupsafe.620c06c9", "markupsafe"),
    ("swesmith/scikit-learn__scikit-learn.586f4318", "scikit-learn"),
    ("pypi/scikit_learn", "scikit-learn"),
    ("pypi/Sphinx", "sphinx"),
    ("Project-MONAI/MONAI", "monai"),
])
def test_repo_key(repo, key):
    assert repo_key(repo) == key


@pytest.mark.parametrize("repo,overlap", [
    ("pypi/requests", ("swe-bench-verified",)),
    ("pypi/Sphinx", ("swe-bench-verified",)),
    ("swesmith/pydata__xarray.7c4e2ac8", ("swe-bench-verified",)),
    ("someone/django", ("swe-bench-verified",)),  # a fork holds the same code
    ("pypi/toolz", ()),
    ("pypi/requests-toolbelt", ()),
    ("getmoto/moto", ()),
])
def test_overlap(repo, overlap):
    assert overlapping_benchmarks(repo, ("swe-bench-verified",)) == overlap


def test_synthesized_tasks_flagged_excluded_or_left(caplog):
    tasks = [synthesized("toolz"), synthesized("requests"), synthesized("tabulate")]
    with caplog.at_level(logging.WARNING, logger="pipeline.tasks.decontam"):
        flagged, rejects = decontaminate(tasks, "flag", ("swe-bench-verified",))
    assert rejects == [] and [t.instance_id for t in flagged] == [t.instance_id for t in tasks]
    assert json.loads(flagged[1].provenance) == {**json.loads(tasks[1].provenance),
                                                 "eval_overlap": ["swe-bench-verified"]}
    assert flagged[0] == tasks[0] and flagged[2] == tasks[2]
    assert any("pypi/requests" in r.getMessage() and tasks[1].instance_id in r.getMessage() for r in caplog.records)

    kept, rejects = decontaminate(tasks, "exclude", ("swe-bench-verified",))
    assert kept == [tasks[0], tasks[2]]
    assert [(r.item, r.stage) for r in rejects] == [(tasks[1].instance_id, "decontaminate")]
    assert "pypi/requests is in evaluation benchmark swe-bench-verified" in rejects[0].reason
    assert "sources.decontaminate" in rejects[0].reason  # says what to change

    assert decontaminate(tasks, "off", ("swe-bench-verified",)) == (tasks, [])
    assert decontaminate(tasks, "exclude", ()) == (tasks, [])


def test_a_benchmark_given_as_a_file(tmp_path):
    path = tmp_path / "my_eval.txt"
    path.write_text("# the repos our held-out eval draws on\npypa/toolz  # a comment\n\ntabulate/tabulate\n")
    kept, rejects = decontaminate([synthesized("toolz"), synthesized("requests")], "exclude", (str(path),))
    assert [t.repo for t in kept] == ["pypi/requests"] and [r.item for r in rejects] == ["toolz__1.0__invert_if__c0ffee"]


def test_bad_settings_name_the_fix():
    with pytest.raises(ValueError, match="not one of"):
        decontaminate([synthesized("toolz")], "drop", ("swe-bench-verified",))
    with pytest.raises(ValueError, match="'swe-bench-lite' is not shipped .*'swe-bench-verified'"):
        decontaminate([synthesized("toolz")], "flag", ("swe-bench-lite",))
