"""Tasks synthesized offline: bugs injected into real PyPI packages (AST mutations, teacher rewrites,
combinations), each validated by running the package's tests. `synth.synthesize` is the entry point."""
