"""The camera table's slots: shared by peer (process, or address for remote tcp), never by
invented camera id; served cameras keep a reserve, and churn is bounded per peer. The rule
tests run with no reserve (reserve=0): they are about the shares."""

from __future__ import annotations

from stgcnd.server.cameras import EVICT_IDLE_S, MIN_IDLE_S, CameraTable


def fill(table: CameraTable, peer: str, names: list[str], now: float) -> None:
    for name in names:
        cam, _ = table.get(name, now, peer)
        assert cam is not None, name


def test_a_peer_that_filled_the_table_gives_way_to_a_newcomer_at_once():
    table = CameraTable(4, reserve=0)
    fill(table, "pid:1", ["x0", "x1", "x2", "x3"], now=0.0)
    cam, evicted = table.get("real", 0.01, "pid:2")
    assert cam is not None and evicted is not None
    assert (evicted.camera, evicted.rule) == ("x0", "over-share")
    assert cam.lane in range(4) and len(table) == 4


def test_a_peer_over_its_share_only_churns_its_own_slots():
    table = CameraTable(4, reserve=0)
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
    table = CameraTable(2, reserve=0)
    fill(table, "pid:1", ["a", "b"], now=0.0)
    assert table.get("c", MIN_IDLE_S / 2, "pid:1") == (None, None)
    cam, evicted = table.get("c", MIN_IDLE_S + 0.1, "pid:1")
    assert cam is not None and evicted is not None and evicted.rule == "own-share"


def test_when_every_peer_holds_its_share_only_long_idle_cameras_give_way():
    table = CameraTable(3, reserve=0)
    for i in range(3):
        fill(table, f"pid:{i}", [f"cam{i}"], now=float(i))
    assert table.get("new", 3.0, "pid:9") == (None, None)
    cam, evicted = table.get("new", EVICT_IDLE_S + 0.5, "pid:9")
    assert cam is not None and evicted is not None
    assert (evicted.camera, evicted.rule) == ("cam0", "idle")


def test_a_camera_with_a_request_in_flight_is_never_taken():
    table = CameraTable(2, reserve=0)
    fill(table, "pid:1", ["a", "b"], now=0.0)
    for name in ("a", "b"):
        table.cameras[name].in_flight = 1
    assert table.get("c", 100.0, "pid:2") == (None, None)
    table.cameras["b"].in_flight = 0
    cam, evicted = table.get("c", 100.0, "pid:2")
    assert cam is not None and evicted is not None and evicted.camera == "b"


def test_a_camera_moves_to_the_peer_that_uses_it_and_idle_ones_are_reclaimed():
    table = CameraTable(3, reserve=0)
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
    table = CameraTable(3, reserve=0)
    fill(table, "pid:1", ["stale"], now=0.0)
    fill(table, "pid:2", ["a", "b"], now=EVICT_IDLE_S + 9.0)
    cam, evicted = table.get("new", EVICT_IDLE_S + 9.5, "pid:3")
    assert cam is not None and evicted is not None
    assert (evicted.camera, evicted.rule) == ("stale", "idle")


def test_a_peer_at_its_share_may_take_a_long_idle_camera_of_another():
    table = CameraTable(2, reserve=0)
    fill(table, "pid:2", ["gone"], now=0.0)
    fill(table, "pid:1", ["mine"], now=100.0)
    cam, evicted = table.get("mine-2", 100.1, "pid:1")
    assert cam is not None and evicted is not None and evicted.camera == "gone"


def test_over_share_peers_are_tried_biggest_first_past_busy_ones():
    table = CameraTable(6, reserve=0)
    fill(table, "pid:1", ["a1", "a2", "a3"], now=0.0)
    fill(table, "pid:2", ["b1", "b2", "b3"], now=0.1)
    for name in ("a1", "a2", "a3"):
        table.cameras[name].in_flight = 1
    cam, evicted = table.get("c", 0.2, "pid:3")  # share ceil(6/3) = 2: both are over
    assert cam is not None and evicted is not None and evicted.camera == "b1"


# ------------------------------------------------------------------ served cameras (#36)
def serve(table: CameraTable, peer: str, name: str, now: float) -> None:
    cam, _ = table.get(name, now, peer)
    assert cam is not None, name
    table.mark_served(cam)


def test_invented_ids_never_fill_the_reserve_of_served_cameras():
    table = CameraTable(16)  # reserve 2
    assert table.reserve == 2
    serve(table, "pid:1", "real", -100.0)  # served once, then gone quiet and reclaimed
    table.reclaim_idle(-1.0, idle_timeout=5.0)
    for p in range(16):  # 16 peers inventing ids as fast as they can, nothing ever idle
        for i in range(200):
            table.get(f"x{p}-{i}", 0.001 * i, f"pid:{p}")
    assert len(table) == 14  # never-served cameras hold max_cameras - reserve slots
    for p in range(90, 99):  # newcomers of other peers never get the reserve
        table.get(f"new{p}", 0.2, f"pid:{p}")
        assert len(table) == 14
    cam, evicted = table.get("real", 0.3, "pid:1")  # the served one comes back: room
    assert cam is not None and evicted is None and len(table) == 15


def test_a_served_camera_coming_back_takes_the_reserved_slot():
    table = CameraTable(8, reserve=1)
    serve(table, "pid:1", "real", 0.0)
    table.reclaim_idle(10.0, idle_timeout=5.0)  # it went away; its id is remembered
    assert "real" not in table.cameras and "real" in table.served
    for p in range(8):
        for i in range(50):
            table.get(f"x{p}-{i}", 10.0 + 0.001 * i, f"pid:{p}")
    assert len(table) == 7
    cam, evicted = table.get("real", 10.1, "pid:1")
    assert cam is not None and evicted is None and cam.served  # the reserved slot


def test_a_returning_served_camera_evicts_the_least_recent_never_served_one():
    table = CameraTable(4, reserve=1)
    serve(table, "pid:1", "real", 0.0)
    table.reclaim_idle(10.0, idle_timeout=5.0)
    serve(table, "pid:2", "kept", 10.0)
    for i in range(3):
        table.get(f"x{i}", 10.0 + i * 0.01, "pid:3")
    table.cameras["x0"].in_flight = 1
    assert len(table) == 4 and not table._free_lanes
    cam, evicted = table.get("real", 10.05, "pid:1")  # nothing quiet, every share held
    assert cam is not None and evicted is not None
    assert (evicted.camera, evicted.rule) == ("x1", "unserved")
    assert "kept" in table.cameras and "x0" in table.cameras


def test_a_never_served_camera_never_takes_an_active_served_cameras_slot():
    table = CameraTable(4, reserve=1)
    for i in range(4):  # four served cameras of one peer, over any share
        serve(table, "pid:1", f"s{i}", 0.0)
    for t in range(1, 40):  # a newcomer of another peer, with the table full of them
        cam, evicted = table.get(f"new{t}", t * 0.1, "pid:2")
        assert cam is None and evicted is None
        for i in range(4):
            table.get(f"s{i}", t * 0.1, "pid:1")
    # Long idle served cameras do give way (the same 5 s as before) ...
    cam, evicted = table.get("new", 4.0 + EVICT_IDLE_S, "pid:2")
    assert cam is not None and evicted is not None and evicted.rule == "idle"
    # ... and a served camera coming back takes a never-served one's slot at once.
    cam, evicted = table.get("s0", 4.0 + EVICT_IDLE_S, "pid:1")
    assert cam is not None and (evicted is None or evicted.camera == "new")


def test_an_invented_id_takes_only_never_served_slots_by_the_share_rules():
    table = CameraTable(8, reserve=2)
    for i in range(3):
        serve(table, "pid:1", f"s{i}", 0.0)
    for i in range(5):  # five never-served, over their peer's share with 3 peers (3)
        table.get(f"x{i}", 0.0, "pid:2")
    assert len(table) == 8
    cam, evicted = table.get("y", 0.5, "pid:3")
    assert cam is not None and evicted is not None
    assert (evicted.camera, evicted.rule) == ("x0", "over-share")
    assert all(f"s{i}" in table.cameras for i in range(3))


def test_eviction_churn_is_bounded_per_peer_per_second():
    table = CameraTable(8, reserve=0)
    refused = 0
    for i in range(10_000):  # one peer, a new id every 0.1 ms, each long idle right away
        now = i * 1e-4
        cam, _ = table.get(f"x{i}", now, "pid:1")
        table.get("victim-peer", now, "pid:2")  # another peer stays in the table throughout
        if cam is None:
            refused += 1
        # Age every camera so that each new one may evict (rule 1) at once.
        for c in table.cameras.values():
            if c.name != "victim-peer":
                c.last_activity = -100.0
    assert table.evictions <= 8 * 2  # at most max_cameras a second, over one second
    assert table.churn_refused > 9_000 and refused == table.churn_refused
    assert "victim-peer" in table.cameras
    cam, _ = table.get("later", 1.5, "pid:1")  # a new second: it may evict again
    assert cam is not None


def test_served_ids_are_remembered_in_bounded_memory():
    table = CameraTable(2, reserve=1)
    for i in range(100):
        serve(table, "pid:1", f"c{i}", float(i) * 10)
        table.reclaim_idle(float(i) * 10 + 6, idle_timeout=5.0)
    assert len(table.served) == 4 * 2
    assert list(table.served)[-1] == "c99" and "c0" not in table.served


def test_a_peer_holding_every_slot_with_active_served_cameras_gives_one_to_a_returning_camera():
    """Issue #41: one peer's served cameras, all sending every 0.2 s, hold every slot; a
    camera of another peer, served before, comes back: it takes the least recently active of
    them at once, and that one, asking again, is refused while its peer's others stay busy."""
    table = CameraTable(4)
    legit, _ = table.get("legit", 0.0, "pid:2")
    assert legit is not None
    table.mark_served(legit)
    table.reclaim_idle(400.0, 300.0)  # away: it left the table, its id is remembered
    for t in range(20):
        for i in range(4):
            cam, _ = table.get(f"hold-{i}", 400.0 + t * 0.2 + i * 0.01, "pid:1")
            assert cam is not None
            table.mark_served(cam)
    now = 400.0 + 20 * 0.2
    cam, evicted = table.get("legit", now, "pid:2")
    assert cam is not None and evicted is not None
    assert (evicted.camera, evicted.peer, evicted.rule) == ("hold-0", "pid:1", "over-share")
    assert table.get("hold-0", now + 0.01, "pid:1") == (None, None)
