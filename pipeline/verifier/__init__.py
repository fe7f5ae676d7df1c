"""The verifier: a task's sandbox made ready (`environment`), a patch graded in it as root (`grading`, its
shell in `steps`), the pytest plugin that signs each test's outcome (`pytest_guard`), the JUnit report read
back (`junit`) and the static flags on a patch (`guard`).

It sits below everything that grades (synthesis, rollouts, guidance, evaluation) and imports only
`pipeline.core.records` and the `sandbox` package.
"""
