"""The web dashboard over a pool's servers (`conveyor dashboard`): see docs/dashboard.md."""

from __future__ import annotations

from conveyor.dashboard.runtime import DEFAULT_DASHBOARD_PORT, Dashboard

__all__ = ["DEFAULT_DASHBOARD_PORT", "Dashboard"]
