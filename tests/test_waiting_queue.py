"""The waiting queue keeps DESIGN §2's order (preempted requests first, latest preemption
first, then arrivals) while each change costs what changed, and policies read it live."""
import pytest

from policylab.core.waiting_queue import QueueView, WaitingQueue


def queue_of(arrivals, put_back=()):
    views = {rid: f"view{rid}" for rid in range(20)}
    q = WaitingQueue(views)
    for rid in arrivals:
        q.append(rid)
    if put_back:
        q.put_back(list(put_back))
    return q, QueueView(q)


def test_preempted_requests_wait_in_front_latest_preemption_first():
    q, view = queue_of([3, 4, 5], put_back=[9, 8])
    q.put_back([7])
    assert list(q.ids()) == [7, 9, 8, 3, 4, 5]
    assert list(view) == ["view7", "view9", "view8", "view3", "view4", "view5"]
    q.remove([9, 4])
    assert list(q.ids()) == [7, 8, 3, 5] and len(q) == 4 and 8 in q and 9 not in q
    assert q.in_queue_order([5, 3, 8]) == [8, 3, 5]


def test_the_view_is_live_and_reads_like_a_tuple():
    q, view = queue_of([1, 2, 3])
    assert len(view) == 3 and view and view[0] == "view1" and view[-1] == "view3"
    assert view[:2] == ("view1", "view2") and view[1:] == ("view2", "view3")
    assert list(reversed(view)) == ["view3", "view2", "view1"] and view == ("view1", "view2", "view3")
    q.append(4)                            # no copy: the next read sees the change
    q.remove([1, 2, 3, 4])
    assert not view and len(view) == 0 and view == ()
    with pytest.raises(IndexError):
        view[0]
    with pytest.raises(TypeError):
        view[0] = "x"


@pytest.mark.timeout(60)
def test_a_long_queue_served_from_its_front_keeps_its_order_through_compaction():
    views = {rid: f"view{rid}" for rid in range(30_000)}
    q = WaitingQueue(views)
    view = QueueView(q)
    for rid in range(20_000):
        q.append(rid)
    expected = list(range(20_000))
    compacted = False
    for start in range(0, 12_000, 3):                   # the oldest start first, arrivals keep coming
        q.remove([start, start + 1])
        q.append(20_000 + start // 3)
        expected.append(20_000 + start // 3)
        compacted |= q._holes == 0                       # (its removed slots dropped, live ones kept)
    expected = [rid for rid in expected if not (rid < 12_000 and rid % 3 != 2)]
    assert compacted and list(q.ids()) == expected and len(q) == len(expected)
    assert view[0] == f"view{expected[0]}" and q.in_queue_order([expected[-1], expected[0]]) == \
        [expected[0], expected[-1]]
