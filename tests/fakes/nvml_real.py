"""The installed nvidia-ml-py (``N``): the fakes' constants, structs and error classes.

Found even when the ``pynvml`` shim (tests/fakes/pynvml_shim) shadows it on sys.path.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType


def _real_pynvml() -> ModuleType:
    shim = sys.modules.get("pynvml")
    if shim is None or not getattr(shim, "__fake_shim__", False):
        import pynvml

        return pynvml
    cached = sys.modules.get("_real_pynvml")
    if cached is not None:
        return cached
    shim_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pynvml_shim")
    path = [p for p in sys.path if os.path.abspath(p or ".") != shim_dir]
    spec = importlib.machinery.PathFinder.find_spec("pynvml", path)
    if spec is None or spec.loader is None:
        raise ImportError("nvidia-ml-py (pynvml) must be installed for the fake's types")
    real = importlib.util.module_from_spec(spec)
    # pynvml looks itself up as sys.modules["pynvml"] while it loads; lend it the name.
    sys.modules["pynvml"] = real
    try:
        spec.loader.exec_module(real)
    finally:
        sys.modules["pynvml"] = shim
    sys.modules["_real_pynvml"] = real
    return real


N = _real_pynvml()
