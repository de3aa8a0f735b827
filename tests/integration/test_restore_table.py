"""The Python client's restore table (clients/python/moongate/restore.py) on its own, no daemon:
what a restart (another epoch) loses and what a reconnect to the same daemon (the same epoch)
keeps."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "clients", "python"))
from moongate import restore  # noqa: E402


def table():
    t = restore.Table()
    t.add(("segment", 7), "segment 7 ('dst', made by the daemon)")  # no redo: the daemon's
    t.add(("segment", 8), "segment 8 (process memory)", redo=lambda: 80)
    return t


def test_a_restart_loses_what_the_daemon_made_and_makes_the_rest_again():
    t = table()
    assert t.replay(0x1, 0x2) == (1, [])
    assert "did not come back" in t.lost(7)
    assert t.id("segment", 8) == 80


def test_a_reconnect_to_the_same_daemon_loses_nothing():
    """A channel that broke while the daemon went on (the same epoch): the daemon's own segment
    is still there under its id, never said lost (a CI run once failed so, the channel having
    changed state under ThreadSanitizer's pace)."""
    t = table()
    assert t.replay(0x1, 0x1) == (1, [])
    assert t.lost(7) is None
    assert t.id("segment", 7) == 7
