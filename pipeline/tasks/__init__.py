"""What every task goes through, whatever its source: validation (the gold patch resolves it, the empty
patch does not), the search of its container for the answer, decontamination against public benchmarks,
and the copies of a package's source that no container may hold. Sources sit above it:
pipeline/synthesis (bugs injected into PyPI packages) and pipeline/sources (public SWE datasets)."""
