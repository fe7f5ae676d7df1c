"""Payload: a module at the repository root that shadows an installed one of the same name.

`python -m pytest` puts the working directory first on sys.path, ahead of the standard library and
site-packages: this module is imported instead of the real one, loads the real one in its place,
then runs the code appended below it.
"""

import importlib as _importlib
import os as _os
import sys as _sys

_here = _os.path.dirname(_os.path.abspath(__file__))
_saved = _sys.path[:]
_sys.path[:] = [p for p in _sys.path if _os.path.abspath(p or ".") != _here]
del _sys.modules[__name__]
try:
    _importlib.import_module(__name__)
finally:
    _sys.path[:] = _saved
