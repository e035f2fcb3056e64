"""Settings whose import reads the kale settings: a circular import, reported as such."""

from conveyor.compat.kale import settings

QUEUE_CONFIG = settings.QUEUE_CONFIG
