"""Tasks from public SWE datasets in the SWE-bench schema (SWE-bench, SWE-Gym and their kind): rows read,
checked and given the test command of their harness. `swebench_rows.load_tasks` is the entry point."""
