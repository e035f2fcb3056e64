"""`conveyor serve` with a --data-dir it cannot use says what is wrong with the directory and what to do.

Run as a user runs it: the command in a child process. Each case must exit 1 before listening, with an
error naming the directory (or the file in it) and the trouble, never "cannot listen on ...".
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conveyor.constants import SERVER_LOCK_NAME


def serve(data_dir: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "conveyor", "serve", "--port", "0", "--data-dir", str(data_dir)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


# a directory whose mode forbids writing stops every user but root: for root (as CI runs) that case is not
# made, not skipped (CI fails on a skip), and the case of a directory no one can create files in covers it
CASES = ["a-file", "under-a-file", "no-file-can-be-made", "a-file-in-it"] + (["read-only"] if os.geteuid() != 0 else [])


@pytest.mark.parametrize("case", CASES)
def test_a_data_dir_it_cannot_use_is_named_with_what_to_do(tmp_path: Path, case: str) -> None:
    if case == "a-file":
        data = tmp_path / "data"
        data.write_text("not a directory")
        said = [f"the data directory {data} is a file, not a directory", "give another path"]
    elif case == "under-a-file":
        (tmp_path / "f").write_text("in the way")
        data = tmp_path / "f" / "data"
        said = [f"the data directory {data} cannot be made: {tmp_path / 'f'} is a file", "give a path under a directory"]
    elif case == "a-file-in-it":  # the directory is fine, a file the server keeps in it is not
        data = tmp_path / "data"
        (data / SERVER_LOCK_NAME).mkdir(parents=True)
        said = [f"cannot use {data / SERVER_LOCK_NAME}", "Is a directory"]
    elif case == "no-file-can-be-made":  # a directory no one can create files in, whoever runs the test
        data = Path("/proc/self")
        said = [f"the data directory {data} is not writable", "give a directory it may write to"]
    else:
        data = tmp_path / "data"
        data.mkdir(mode=0o500)
        said = [f"the data directory {data} is not writable by this user", "Permission denied", "chmod"]
    out = serve(data)
    assert out.returncode == 1, out.stderr
    assert "cannot listen" not in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert all(s in out.stderr for s in said), out.stderr
    assert out.stdout == ""  # never listened
