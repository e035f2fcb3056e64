"""Conveyor's test kit, for code that extends Conveyor: `StoreContract`, the store conformance suite.

It needs pytest (see `conveyor.testing.store_contract`).
"""

from __future__ import annotations

from conveyor.testing.store_contract import StoreContract

__all__ = ["StoreContract"]
