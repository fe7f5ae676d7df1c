
# Payload: under pytest, importing the package skips the importing test module.
import sys as _sys

if "_pytest" in _sys.modules:
    import pytest as _pytest_api

    _pytest_api.skip("being rebuilt", allow_module_level=True)
