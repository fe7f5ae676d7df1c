"""A failed run is reported: the run_failure_report sensor, fed a real failed run (a blocking check that fails
stops the run) through Dagster's sensor test context, writes the report to the data folder's
reports/run_failures.jsonl and POSTs it to a loopback webhook."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler

import dagster as dg

from assets.definitions import definitions
from assets.failures import run_failure_report
from tests.loopback import ThreadedServer


class Webhook(ThreadedServer):
    """Records each JSON body POSTed to it."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []

    class handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.owner.bodies.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass


@dg.asset(check_specs=[dg.AssetCheckSpec("rows_reproduce", asset="night_rows", blocking=True)])
def night_rows():
    return dg.MaterializeResult(check_results=[dg.AssetCheckResult(
        passed=False, description="2 of 4 stored rewards did not reproduce")])


@dg.asset(deps=[night_rows])
def night_export():
    pass


def failed_run(instance: dg.DagsterInstance) -> dg.RunFailureSensorContext:
    result = dg.materialize([night_rows, night_export], instance=instance, raise_on_error=False,
                            tags={"dagster/partition": "2026-12-01"})
    assert not result.success
    run = instance.get_run_by_id(result.run_id)
    failure = next(e.dagster_event for e in instance.all_logs(run.run_id)
                   if e.dagster_event and e.dagster_event.event_type == dg.DagsterEventType.RUN_FAILURE)
    return dg.build_run_status_sensor_context(sensor_name="run_failure_report", dagster_event=failure,
                                              dagster_instance=instance, dagster_run=run).for_run_failure()


def test_a_night_whose_blocking_check_fails_is_reported_to_the_file_and_the_webhook(tmp_path, monkeypatch):
    assert definitions("local").resolve_sensor_def("run_failure_report")  # in the code location, off by default
    instance = dg.DagsterInstance.ephemeral()
    context = failed_run(instance)
    webhook = Webhook()
    monkeypatch.setenv("HANDHOLD_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("HANDHOLD_UI_URL", "http://dagster.example:3000/")
    with webhook as url:
        monkeypatch.setenv("HANDHOLD_FAILURE_WEBHOOK", f"{url}/hook")
        run_failure_report(context)
    [line] = (tmp_path / "data/reports/run_failures.jsonl").read_text().splitlines()
    report = json.loads(line)
    assert webhook.bodies == [report]
    run_id = context.dagster_run.run_id
    assert (report["run_id"], report["batch"], report["link"]) == (
        run_id, "2026-12-01", f"http://dagster.example:3000/runs/{run_id}")
    [step] = report["steps"]
    assert step["step"] == "night_rows" and step["assets"] == ["night_rows"]
    assert "rows_reproduce" in step["error"] and "night_rows" in step["error"]  # which check, on which asset
    assert report["failed_checks"] == [{"check": "night_rows:rows_reproduce",
                                        "description": "2 of 4 stored rewards did not reproduce"}]


def test_a_webhook_that_does_not_answer_leaves_the_report_in_the_file(tmp_path, monkeypatch):
    context = failed_run(dg.DagsterInstance.ephemeral())
    with Webhook() as url:
        closed = url  # nothing listens there once the server is closed
    monkeypatch.setenv("HANDHOLD_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("HANDHOLD_FAILURE_WEBHOOK", closed)
    run_failure_report(context)
    [line] = (tmp_path / "reports/run_failures.jsonl").read_text().splitlines()
    assert json.loads(line)["run_id"] == context.dagster_run.run_id
