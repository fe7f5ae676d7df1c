"""Task sources: SWE-bench-format datasets, PyPI bug synthesis, and their validation."""
