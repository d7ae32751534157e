"""The camera table's slots: shared by peer (process or address), never by invented camera id."""

from __future__ import annotations

from stgcnd.server.cameras import EVICT_IDLE_S, MIN_IDLE_S, CameraTable


def fill(table: CameraTable, peer: str, names: list[str], now: float) -> None:
    for name in names:
        cam, _ = table.get(name, now, peer)
        assert cam is not None, name


def test_a_peer_that_filled_the_table_gives_way_to_a_newcomer_at_once():
    table = CameraTable(4)
    fill(table, "pid:1", ["x0", "x1", "x2", "x3"], now=0.0)
    cam, evicted = table.get("real", 0.01, "pid:2")
    assert cam is not None and evicted is not None
    assert (evicted.camera, evicted.rule) == ("x0", "over-share")
    assert cam.lane in range(4) and len(table) == 4


def test_a_peer_over_its_share_only_churns_its_own_slots():
    table = CameraTable(4)
    fill(table, "pid:1", ["x0", "x1", "x2", "x3"], now=0.0)
    table.get("real", 0.01, "pid:2")
    # The flooding peer invents more ids: it holds 3 of 4 with two peers (share 2), so only
    # its own cameras quiet for MIN_IDLE_S can give way, never the newcomer's.
    for i in range(10_000):
        now = 0.02 + i * 1e-4
        table.get("real", now, "pid:2")  # the real camera keeps sending
        table.get(f"y{i}", now, "pid:1")
    assert "real" in table.cameras and len(table) == 4
    assert table.cameras["real"].peer == "pid:2"


def test_a_peer_at_its_share_waits_for_its_own_cameras_to_idle():
    table = CameraTable(2)
    fill(table, "pid:1", ["a", "b"], now=0.0)
    assert table.get("c", MIN_IDLE_S / 2, "pid:1") == (None, None)
    cam, evicted = table.get("c", MIN_IDLE_S + 0.1, "pid:1")
    assert cam is not None and evicted is not None and evicted.rule == "own-share"


def test_when_every_peer_holds_its_share_only_long_idle_cameras_give_way():
    table = CameraTable(3)
    for i in range(3):
        fill(table, f"pid:{i}", [f"cam{i}"], now=float(i))
    assert table.get("new", 3.0, "pid:9") == (None, None)
    cam, evicted = table.get("new", EVICT_IDLE_S + 0.5, "pid:9")
    assert cam is not None and evicted is not None
    assert (evicted.camera, evicted.rule) == ("cam0", "idle")


def test_a_camera_with_a_request_in_flight_is_never_taken():
    table = CameraTable(2)
    fill(table, "pid:1", ["a", "b"], now=0.0)
    for name in ("a", "b"):
        table.cameras[name].in_flight = 1
    assert table.get("c", 100.0, "pid:2") == (None, None)
    table.cameras["b"].in_flight = 0
    cam, evicted = table.get("c", 100.0, "pid:2")
    assert cam is not None and evicted is not None and evicted.camera == "b"


def test_a_camera_moves_to_the_peer_that_uses_it_and_idle_ones_are_reclaimed():
    table = CameraTable(3)
    fill(table, "pid:1", ["a", "b"], now=0.0)
    cam, _ = table.get("a", 6.0, "pid:2")
    assert cam is not None and cam.peer == "pid:2"
    assert table.reclaim_idle(now=10.0, idle_timeout=5.0) == [("b", 10.0)]
    assert list(table.cameras) == ["a"]
    cam, _ = table.get("c", 10.0, "pid:3")
    assert cam is not None  # b's lane is free again
    lanes = [c.lane for c in table.cameras.values()]
    assert len(set(lanes)) == len(lanes) == 2


def test_a_long_idle_camera_goes_before_an_active_one_of_an_over_share_peer():
    table = CameraTable(3)
    fill(table, "pid:1", ["stale"], now=0.0)
    fill(table, "pid:2", ["a", "b"], now=EVICT_IDLE_S + 9.0)
    cam, evicted = table.get("new", EVICT_IDLE_S + 9.5, "pid:3")
    assert cam is not None and evicted is not None
    assert (evicted.camera, evicted.rule) == ("stale", "idle")


def test_a_peer_at_its_share_may_take_a_long_idle_camera_of_another():
    table = CameraTable(2)
    fill(table, "pid:2", ["gone"], now=0.0)
    fill(table, "pid:1", ["mine"], now=100.0)
    cam, evicted = table.get("mine-2", 100.1, "pid:1")
    assert cam is not None and evicted is not None and evicted.camera == "gone"


def test_over_share_peers_are_tried_biggest_first_past_busy_ones():
    table = CameraTable(6)
    fill(table, "pid:1", ["a1", "a2", "a3"], now=0.0)
    fill(table, "pid:2", ["b1", "b2", "b3"], now=0.1)
    for name in ("a1", "a2", "a3"):
        table.cameras[name].in_flight = 1
    cam, evicted = table.get("c", 0.2, "pid:3")  # share ceil(6/3) = 2: both are over
    assert cam is not None and evicted is not None and evicted.camera == "b1"
