"""A task module whose import fails with a message of several lines.

As numpy's C-extension error does: the pre-flight must still report it (tests/spark/test_preflight.py).
"""

raise ImportError("Importing the C-extensions failed.\nHere is how to debug it:\n  see the docs")
