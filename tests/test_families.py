"""The guidance families head to head (pipeline/rollouts/families.py), on a batch worked out by hand."""

from __future__ import annotations

from pipeline.rollouts.families import family_chart, family_markdown, family_rows
from pipeline.core.records import GuidancePlan
from tests.test_datasets_build import traj


def plan(iid: str, kind: str, accepted: bool = True, leaked: bool = False, K: int = -1, k_star: int = -1):
    return GuidancePlan(iid, kind, "hint", "rule", accepted=accepted, leaked=leaked, K=K, k_star=k_star,
                        reason="" if accepted else "set aside")


PLANS = [plan("t1", "plan"), plan("t2", "plan"), plan("t3", "plan", accepted=False, leaked=True),
         plan("t1", "action", K=4, k_star=2), plan("t2", "action", K=5, k_star=5),
         plan("t3", "action", accepted=False), plan("t1", "hindsight"),
         plan("t1", "combined"), plan("t2", "combined"), plan("t3", "combined", accepted=False, leaked=True)]
GUIDED = [traj("p1", "t1", "plan", 1.0), traj("p2", "t1", "plan"), traj("p3", "t2", "plan"),
          traj("p4", "t2", "plan", infra_error="container died"),  # counts for nothing
          traj("p5", "t3", "plan", 1.0),  # its plan was set aside: not a rescue of the family's
          traj("a1", "t1", "action"), traj("a2", "t1", "action"), traj("a3", "t2", "action", 1.0),
          traj("a4", "t2", "action", 1.0), traj("h1", "t1", "hindsight"),
          traj("h2", "t1", "hindsight", 1.0, infra_error="engine gone"),
          # combined guidance on the plan's groups: it rescues t2 too
          traj("c1", "t1", "combined"), traj("c2", "t1", "combined", 1.0), traj("c3", "t2", "combined", 1.0),
          traj("c4", "t2", "combined", 1.0, infra_error="engine gone"), traj("c5", "t3", "combined", 1.0)]


def test_each_family_counts_its_own_groups_attempts_and_set_asides():
    rows = {r["family"]: r for r in family_rows(PLANS, GUIDED)}
    assert list(rows) == ["plan", "combined", "hindsight", "action"]  # the vocabulary's order
    assert rows["plan"] == {"family": "plan", "groups_failed": 3, "groups_tried": 2, "groups_rescued": 1,
                            "guided_attempts": 3, "guided_pass_rate": 0.333, "k_star_over_K": None,
                            "set_aside_leaking": 1, "set_aside_other": 0}
    # c1 and c2 on t1, c3 on t2 (c4 lost to the infrastructure, c5 on t3 whose guidance leaked): 2 of 3 passed
    assert rows["combined"] == {"family": "combined", "groups_failed": 3, "groups_tried": 2, "groups_rescued": 2,
                                "guided_attempts": 3, "guided_pass_rate": 0.667, "k_star_over_K": None,
                                "set_aside_leaking": 1, "set_aside_other": 0}
    assert rows["action"] == {"family": "action", "groups_failed": 3, "groups_tried": 2, "groups_rescued": 1,
                              "guided_attempts": 4, "guided_pass_rate": 0.5, "k_star_over_K": 0.75,
                              "set_aside_leaking": 0, "set_aside_other": 1}
    assert rows["hindsight"] == {"family": "hindsight", "groups_failed": 1, "groups_tried": 1, "groups_rescued": 0,
                                 "guided_attempts": 1, "guided_pass_rate": 0.0, "k_star_over_K": None,
                                 "set_aside_leaking": 0, "set_aside_other": 0}


def test_the_table_shows_every_family_and_a_picture():
    rows = family_rows(PLANS, GUIDED)
    lines = family_markdown(rows).splitlines()
    assert lines[0].startswith("| family | groups_failed |")
    assert lines[2] == "| plan | 3 | 2 | 1 | 3 | 0.333 | - | 1 | 0 |"
    assert lines[3] == "| combined | 3 | 2 | 2 | 3 | 0.667 | - | 1 | 0 |"
    assert lines[5] == "| action | 3 | 2 | 1 | 4 | 0.5 | 0.75 | 0 | 1 |"
    assert len(lines) == 6 and family_chart(rows).startswith("![share of tried groups rescued")
