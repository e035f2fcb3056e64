"""Conveyor on Apache Spark: the embedded session and the TaskGraph runtime."""

from __future__ import annotations
