"""The optional compiled kernels: `compatfs._accel`, built by setup.py where
a C compiler is at hand, or None (without it, or with `COMPATFS_NO_ACCEL=1`
in the environment).  Each kernel gives the bytes its numpy counterpart
gives; the numpy code stays the reference and the default install's."""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def _load() -> ModuleType | None:
    if os.environ.get("COMPATFS_NO_ACCEL", "") not in ("", "0"):
        return None
    try:
        return importlib.import_module("compatfs._accel")
    except ImportError:
        return None


native = _load()
