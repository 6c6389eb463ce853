"""GPU-scale and phased workloads are built with the bench generators at the stated counts."""

from kvloop.engine.sim.scenarios import gpu_w1, phased_w1


def test_gpu_w1_counts():
    wl = gpu_w1(rate=4.0, duration_s=100.0)
    assert len(wl.requests) == 200 and len(wl.sessions) == 50
    assert wl.num_requests == 400
    assert max(r.arrival_s for r in wl.requests) < 140
    assert max(t for r in wl.requests for t in r.prompt) < 128256


def test_phased_shares_documents_and_shifts_time():
    wl = phased_w1([2.0, 8.0], phase_s=20.0)
    p0 = [r for r in wl.requests if r.request_id.startswith("p0")]
    p1 = [r for r in wl.requests if r.request_id.startswith("p1")]
    assert len(p1) == 4 * len(p0)
    assert all(r.arrival_s >= 20.0 for r in p1)
    docs0 = {tuple(r.prompt[:2000]) for r in p0}
    docs1 = {tuple(r.prompt[:2000]) for r in p1}
    assert docs0 & docs1  # the same document set in both phases
    assert len({r.request_id for r in wl.requests}) == len(wl.requests)
