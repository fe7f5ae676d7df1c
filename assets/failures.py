"""A report for every failed run of the code location: which step and asset failed, what it raised (a blocking
check that failed included), and the link to the run in the UI.

Where it goes, set in the environment of the Dagster daemon (like HANDHOLD_NIGHTLY_CRON):
    HANDHOLD_DATA_DIR          its reports/run_failures.jsonl gets one JSON object per failed run ("data")
    HANDHOLD_FAILURE_WEBHOOK   a URL that also gets each report as a JSON POST (unset: the file only)
    HANDHOLD_UI_URL            the UI's address in the run links (http://localhost:3000)
A webhook that does not answer is logged; the file keeps the report.
"""

from __future__ import annotations

import json
import os
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import dagster as dg

REPORTS = Path("reports") / "run_failures.jsonl"


def failure_report(context: dg.RunFailureSensorContext, ui_url: str) -> dict:
    """The report of the failed run: its job, batch, failed steps with their assets and errors, the checks that
    failed with what they said, the link."""
    run = context.dagster_run
    steps = []
    for event in context.get_step_failure_events():
        error = event.event_specific_data.error
        while error is not None and error.cause is not None:  # what the step itself raised, under Dagster's wrapping
            error = error.cause
        assets = [key.to_user_string() for key in (run.asset_selection or ())
                  if key.path[-1] == event.step_key.split(".")[-1]]
        steps.append({"step": event.step_key, "assets": assets or [event.step_key],
                      "error": (error.message.strip() if error is not None else event.message or "")[:4000]})
    checks = [{"check": f"{e.asset_key.to_user_string()}:{e.check_name}", "description": e.description or ""}
              for e in (entry.dagster_event.event_specific_data for entry in context.instance.all_logs(
                  run.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION)) if not e.passed]
    return {"run_id": run.run_id, "job": run.job_name, "batch": run.tags.get("dagster/partition", ""),
            "failed_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "message": context.failure_event.message or "", "steps": steps, "failed_checks": checks,
            "link": f"{ui_url.rstrip('/')}/runs/{run.run_id}"}


def send_report(report: dict, data_dir: str | Path, webhook: str = "") -> Path:
    """Append the report to data_dir/reports/run_failures.jsonl and POST it to `webhook` when given; the file."""
    path = Path(data_dir) / REPORTS
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(report) + "\n")
    if webhook:
        request = urllib.request.Request(webhook, data=json.dumps(report).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()
    return path


@dg.run_failure_sensor(name="run_failure_report", default_status=dg.DefaultSensorStatus.STOPPED,
                       description="Each failed run (a step that raised, a blocking check that failed) reported to "
                                   "$HANDHOLD_DATA_DIR/reports/run_failures.jsonl and $HANDHOLD_FAILURE_WEBHOOK.")
def run_failure_report(context: dg.RunFailureSensorContext):
    report = failure_report(context, os.environ.get("HANDHOLD_UI_URL", "http://localhost:3000"))
    webhook = os.environ.get("HANDHOLD_FAILURE_WEBHOOK", "")
    try:
        path = send_report(report, os.environ.get("HANDHOLD_DATA_DIR", "data"), webhook)
    except OSError as exc:  # the webhook did not answer: the file has the report
        context.log.warning(f"run {report['run_id']}: the failure report could not be POSTed to {webhook}: {exc}")
        return
    context.log.info(f"run {report['run_id']} failed; reported in {path}{f' and to {webhook}' if webhook else ''}")
