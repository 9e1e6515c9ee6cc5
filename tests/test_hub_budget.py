"""The Hub request budget: its arithmetic, and huggingface_hub's real client paced by it against a limited local Hub."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from hubserver import HubServer
from zoo_convert.farm import hub_budget
from zoo_convert.farm.hub_budget import Budget, HubLimits, LocalGovernor, bucket_of, retry_after

pytestmark = pytest.mark.alone  # threads paced against the clock by a Hub that counts its windows

REPO = "zoo/tiny"


def _answered_at_once(budget: Budget, n: int, now: float = 0.0) -> list[float]:
    """``n`` requests one after another, each answered the moment it goes; their grant times."""
    grants = []
    for _ in range(n):
        wait = budget.reserve("api", now)
        assert wait is not None
        now += wait
        budget.release("api", now)
        grants.append(now)
    return grants


def test_no_window_ever_holds_more_than_the_limit() -> None:
    limits = HubLimits(api=60, resolvers=10, window_s=10.0)
    budget = Budget(limits)
    grants = _answered_at_once(budget, 250)
    grants += [_answered_at_once(budget, 1, now=t)[0] for t in (45.0, 45.5)]
    assert grants == sorted(grants)
    assert all(later - earlier >= limits.window_s for earlier, later in zip(grants, grants[60:]))
    # As fast as the limit allows: 60 at once, then 60 more per window (plus the margin).
    assert grants[59] == 0.0 and grants[60] == pytest.approx(limits.window_s + 0.5)
    assert grants[249] == pytest.approx((math.ceil(250 / 60) - 1) * (limits.window_s + 0.5))
    assert grants[250:] == [45.0, 45.5]  # a request that finds room goes at once


def test_a_slot_is_held_until_a_window_after_the_answer() -> None:
    budget = Budget(HubLimits(api=2, window_s=10.0))
    assert budget.reserve("api", now=0.0) == 0.0 and budget.reserve("api", now=0.0) == 0.0
    # Both still unanswered: no time can be promised yet, however long the Hub takes to see them.
    assert budget.reserve("api", now=0.1) is None
    budget.release("api", now=3.0)  # a slow answer: the Hub may have stamped it as late as this
    assert budget.reserve("api", now=3.1) == pytest.approx(3.0 + 10.5 - 3.1)
    # The other one never answers (its caller died): a window after its grant it is taken as answered.
    assert budget.reserve("api", now=11.0) == pytest.approx(10.5)


def test_a_pause_holds_back_every_later_request_and_voids_earlier_slots() -> None:
    budget = Budget(HubLimits(api=100, window_s=10.0))
    assert budget.reserve("api", now=0.0) == 0.0
    budget.pause("api", until=5.0)
    assert not budget.clear("api", now=1.0) and budget.clear("api", now=5.0)
    assert budget.reserve("api", now=1.0) == pytest.approx(4.0)
    assert budget.reserve("resolvers", now=1.0) == 0.0  # the other bucket goes on


def test_a_budget_handed_over_keeps_what_was_spent() -> None:
    local = LocalGovernor(HubLimits(api=5, window_s=60.0))
    for _ in range(5):
        local.acquire("api")
        local.release("api")
    successor = Budget(HubLimits(api=5, window_s=60.0), local.history(), now=1000.0)
    assert successor.reserve("api", now=1000.0) > 55.0
    assert successor.reserve("resolvers", now=1000.0) == 0.0


def test_requests_are_sorted_into_the_hubs_buckets() -> None:
    assert bucket_of("https://huggingface.co/api/models/org/name/revision/main") == "api"
    assert bucket_of("https://huggingface.co/org/name.git/info/lfs/objects/batch") is None
    assert bucket_of("https://huggingface.co/org/name/resolve/abc/config.json") == "resolvers"
    assert bucket_of("https://cdn-lfs.hf.co/repos/ab/cd/0123") is None
    assert retry_after({"Retry-After": "2.5"}) == 2.5
    assert retry_after({"RateLimit": '"api";r=0;t=55'}) == 55.0
    assert retry_after({}) is None


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[HubServer]:
    """A Hub holding one tiny repo that allows 20 API requests per 2 s; the process's budget is restored after."""
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "bert"}')
    with HubServer(limits={"api": (20, 2.0)}) as server:
        server.seed_repo(REPO, folder)
        previous = hub_budget.installed()
        yield server
        hub_budget.install(previous)


def _model_infos(server: HubServer, n: int, threads: int = 8, gap_s: float = 0.0) -> tuple[float, list[BaseException]]:
    """``n`` model_info calls on ``threads`` threads (each resting ``gap_s`` after a call); the wall time and the errors."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=server.url, token=False)

    def one(_: int) -> BaseException | None:
        try:
            api.model_info(REPO)
        except Exception as exc:  # noqa: BLE001 - counted by the test
            return exc
        time.sleep(gap_s)
        return None

    t0 = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        errors = [e for e in pool.map(one, range(n)) if e is not None]
    return time.monotonic() - t0, errors


@pytest.mark.slow
def test_threads_drawing_from_one_budget_meet_the_limit_without_a_429(hub: HubServer) -> None:
    hub_budget.install(None)
    _, errors = _model_infos(hub, 80)
    assert len(errors) >= 40 and hub.counts(status=429)["model_info"] == len(errors)  # the storm, unpaced

    hub.forget_requests()  # a fresh window, without waiting the storm's out
    since = time.monotonic()
    limits = HubLimits(api=20, window_s=2.0)
    hub_budget.install(LocalGovernor(limits))
    seconds, errors = _model_infos(hub, 80)
    assert errors == [] and hub.counts(status=429, since=since) == {}
    fastest = (math.ceil(80 / 20) - 1) * Budget(limits).window  # 20 at once, then 20 per window and its margin
    assert fastest <= seconds <= 1.3 * fastest


@pytest.mark.slow
def test_a_request_that_arrives_late_holds_its_slot_until_it_is_answered(hub: HubServer) -> None:
    # CI saw this in the test above: one request of the first 20 reached the Hub a second after its
    # grant, sharing the Hub's window with the next 20. Counted from its grant, the 40th went one too
    # many; counted from its answer, it waits for the late one's window.
    hub.delay_next(r"^/api/models/", 1.2)
    since = time.monotonic()
    hub_budget.install(LocalGovernor(HubLimits(api=20, window_s=2.0)))
    _, errors = _model_infos(hub, 40)
    assert errors == [] and hub.counts(status=429, since=since) == {}
    assert hub.counts(since=since)["model_info"] == 40


@pytest.mark.slow
def test_a_429_pauses_every_thread_and_the_refused_request_is_sent_again(hub: HubServer) -> None:
    hub_budget.install(LocalGovernor(HubLimits(api=20, window_s=2.0)))
    hub.fail_next(r"^/api/models/", 429, retry_after=1.0)
    _, errors = _model_infos(hub, 16, threads=4, gap_s=0.15)  # unpaused, the calls would go on every 0.15 s
    assert errors == []
    answers = [e for e in hub.events if e.route == "model_info"]
    assert [e.status for e in answers].count(429) == 1 and [e.status for e in answers].count(200) == 16
    refused = next(e.t for e in answers if e.status == 429)
    # What the other three threads had already sent may land just after; nothing else until the pause ends.
    during = [e for e in answers if refused + 0.1 < e.t < refused + 0.95]
    assert during == []
