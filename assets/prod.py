"""The prod deployment: `dagster dev -m assets.prod` (endpoints, engine and keys from the environment).

Loading it without one of its environment variables refuses with the list of what is missing.
"""

from __future__ import annotations

import os

from assets.definitions import definitions
from assets.graph import missing_prod_env

_missing = missing_prod_env(dict(os.environ))
if _missing:
    raise RuntimeError("the prod deployment needs these environment variables: " + "; ".join(_missing))

defs = definitions("prod")
