from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from stgcnd.threadname import name_os_thread


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names from /proc")
def test_the_os_sees_the_name_cut_to_fifteen_bytes():
    seen: list[str] = []

    def body() -> None:
        name_os_thread("a-rather-long-thread-name")
        seen.append(Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text())

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert seen == ["a-rather-long-t\n"]
