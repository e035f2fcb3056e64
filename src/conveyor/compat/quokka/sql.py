"""Quokka's `sql` module of spring 2022: its stock executors, under the name its apps imported them by."""

from __future__ import annotations

from .executors import *  # noqa: F403
from .executors import __all__ as __all__
