"""One request budget for every Hub request a farm makes, in every process.

The Hub rations requests per token over 5-minute windows, in buckets: ``api``
(every ``/api/`` call: ``model_info``, listings, preupload, commits; 1,000 per 5
minutes on a free account) and ``resolvers`` (file downloads, ``/resolve/``;
5,000). Beyond that it answers 429 with ``Retry-After``. A farm that lets each
thread and worker find that out alone turns a limit into a retry storm, so all
of them draw from one :class:`Governor` instead::

    huggingface_hub call -> get_session() -> _GovernedSession.send
                                               | governor.acquire(bucket)   waits for a slot
                                               | send
                                               | governor.release(bucket)   the slot counts from the answer
                                               | 429? governor.pause(bucket, Retry-After), send again

:func:`install` hooks the governor into huggingface_hub (``configure_http_backend``),
so every request of the process goes through it, ours or the library's. A
:class:`LocalGovernor` serves the threads of one process; the farm injects one
backed by a Ray actor (``farm/driver.py``) so the driver and every worker share one
budget. Both keep the same arithmetic, :class:`Budget`: a sliding log per bucket
that never lets more than the limit through in any window (so it also holds for
the Hub's fixed windows, wherever they start), a request holding its slot from its
grant until a window after its answer (the latest the Hub can have stamped it), and
a pause after a 429 that holds back every caller of the bucket, not only the one that
was refused.

Requests to other hosts (LFS storage, CDNs) and other paths are not metered.
"""

from __future__ import annotations

import contextlib
import email.utils
import re
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import requests

BUCKETS = ("api", "resolvers")
# Sent again after a 429 at most this often; then the caller sees the 429.
MAX_REPLAYS = 5
# Wait after a 429 that says nothing about when to come back.
DEFAULT_PAUSE_S = 10.0
_RATELIMIT_T = re.compile(r"\bt=(\d+(?:\.\d+)?)")


@dataclass(frozen=True)
class HubLimits:
    """Requests per bucket and window, as the Hub grants them to one token.

    Attributes:
        api: ``/api/`` requests per window (free account: 1,000 per 5 minutes).
        resolvers: ``/resolve/`` downloads per window (free account: 5,000 per 5 minutes).
        window_s: the window, seconds.
    """

    api: int = 1000
    resolvers: int = 5000
    window_s: float = 300.0

    def of(self, bucket: str) -> int:
        """The limit of one bucket."""
        return int(getattr(self, bucket))


def bucket_of(url: str) -> str | None:
    """The budget bucket a request URL draws from; None for requests the Hub does not meter."""
    path = urlsplit(url).path
    if "/resolve/" in path:
        return "resolvers"
    if "/api/" in path:
        return "api"
    return None


class Budget:
    """The pacing arithmetic, without a clock or a lock of its own (callers pass ``now``).

    A slot is held from its grant until the request's answer is back, then for a window after that: the
    Hub stamps a request somewhere between the two, so counting from the answer can never undercount the
    Hub's window, however long the request took to arrive (a retransmitted SYN, a proxy, a process that
    was not scheduled). Counting from the grant did: one late arrival in CI, a second after its grant,
    shared the Hub's window with the next window's 20 (one 429). A request is granted at the earliest time
    at which the window before it holds fewer than the limit of answered and unanswered requests, never
    before an earlier grant (first come, first served) and never during a pause. A margin on the window
    absorbs the difference between our clock and the Hub's windows.
    """

    def __init__(self, limits: HubLimits, history: Mapping[str, Iterable[float]] | None = None, now: float = 0.0) -> None:
        self.limits = limits
        # The Hub's own 300 s windows get 9 s, a test Hub's 2 s ones 0.5 s.
        self.window = limits.window_s + max(0.5, 0.03 * limits.window_s)
        # When each request of the last window was answered, oldest first.
        self.answered: dict[str, deque[float]] = {
            b: deque(sorted(now + t for t in (history or {}).get(b, ()))) for b in BUCKETS}
        # When each request not answered yet was granted, oldest first (some may still be waiting to go).
        self.unanswered: dict[str, deque[float]] = {b: deque() for b in BUCKETS}
        self.last: dict[str, float] = dict.fromkeys(BUCKETS, 0.0)
        self.paused: dict[str, float] = dict.fromkeys(BUCKETS, 0.0)

    def _age(self, bucket: str, now: float) -> None:
        answered, unanswered = self.answered[bucket], self.unanswered[bucket]
        while answered and answered[0] <= now - self.window:
            answered.popleft()
        # Unanswered for a whole window (its caller died with it): taken as answered now, so its slot comes back.
        while unanswered and unanswered[0] <= now - self.window:
            unanswered.popleft()
            answered.append(now)

    def reserve(self, bucket: str, now: float) -> float | None:
        """Take the next slot of ``bucket``: the seconds to wait before sending, or None while every slot is held by
        an unanswered request (ask again after a :meth:`release`)."""
        self._age(bucket, now)
        answered, unanswered = self.answered[bucket], self.unanswered[bucket]
        at = max(now, self.paused[bucket], self.last[bucket])
        # The requests that must leave the window before this one fits, less one: the oldest answered ones.
        surplus = len(answered) + len(unanswered) - self.limits.of(bucket)
        if surplus >= len(answered):
            return None
        if surplus >= 0:
            at = max(at, answered[surplus] + self.window)
        unanswered.append(at)
        self.last[bucket] = at
        return at - now

    def release(self, bucket: str, now: float) -> None:
        """A request of ``bucket`` got its answer (or failed on the way) at ``now``."""
        self._age(bucket, now)
        if self.unanswered[bucket]:
            self.unanswered[bucket].popleft()
            self.answered[bucket].append(now)

    def cancel(self, bucket: str) -> None:
        """A granted slot was not used (a pause voided it): the latest grant is given back."""
        if self.unanswered[bucket]:
            self.unanswered[bucket].pop()

    def pause(self, bucket: str, until: float) -> None:
        """Grant nothing in ``bucket`` before ``until``."""
        self.paused[bucket] = max(self.paused[bucket], until)

    def clear(self, bucket: str, now: float) -> bool:
        """Whether ``bucket`` is not paused at ``now`` (a slot granted before a pause began is void)."""
        return self.paused[bucket] <= now

    def history(self, now: float) -> dict[str, list[float]]:
        """When the requests of the last window were answered, relative to ``now`` (negative: in the past), to hand
        the budget over to another process; an unanswered one as if answered now."""
        return {b: [t - now for t in self.answered[b] if t > now - self.window] + [0.0] * len(self.unanswered[b])
                for b in BUCKETS}


class Governor(Protocol):
    """Where a process draws its Hub requests from."""

    def acquire(self, bucket: str) -> None:
        """Block until one request of ``bucket`` may be sent."""

    def release(self, bucket: str) -> None:
        """The request :meth:`acquire` let go got its answer, or failed on the way."""

    def pause(self, bucket: str, seconds: float) -> None:
        """The Hub refused a request (429): hold every caller of ``bucket`` back for ``seconds``."""


class LocalGovernor:
    """A budget shared by the threads of one process."""

    def __init__(self, limits: HubLimits = HubLimits(), history: Mapping[str, Iterable[float]] | None = None) -> None:
        self._budget = Budget(limits, history, time.monotonic())
        self._answered = threading.Condition()

    def acquire(self, bucket: str) -> None:
        while True:
            with self._answered:
                # A release wakes us; the window bounds the wait in case the unanswered request never is.
                while (wait := self._budget.reserve(bucket, time.monotonic())) is None:
                    self._answered.wait(self._budget.window)
            time.sleep(wait)
            with self._answered:
                if self._budget.clear(bucket, time.monotonic()):
                    return
                self._budget.cancel(bucket)

    def release(self, bucket: str) -> None:
        with self._answered:
            self._budget.release(bucket, time.monotonic())
            self._answered.notify_all()

    def pause(self, bucket: str, seconds: float) -> None:
        with self._answered:
            self._budget.pause(bucket, time.monotonic() + seconds)

    def history(self) -> dict[str, list[float]]:
        """When this budget's requests of the last window were answered, relative to now (:meth:`Budget.history`)."""
        with self._answered:
            return self._budget.history(time.monotonic())


_installed: Governor | None = None


def install(governor: Governor | None) -> Governor | None:
    """Route every huggingface_hub request of this process through ``governor`` (None: the library's default).

    Returns the governor installed before, so a caller can put it back.
    """
    from huggingface_hub import configure_http_backend

    global _installed
    previous, _installed = _installed, governor
    if governor is None:
        configure_http_backend()
    else:
        configure_http_backend(lambda: _GovernedSession(governor))
    return previous


@contextlib.contextmanager
def governing(governor: Governor) -> Iterator[Governor]:
    """``install(governor)`` for the length of a ``with`` block, then put back what was there."""
    previous = install(governor)
    try:
        yield governor
    finally:
        install(previous)


def installed() -> Governor | None:
    """The governor this process's Hub requests go through, if any."""
    return _installed


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds a 429 asks to wait: ``Retry-After`` (seconds or an HTTP date), else the Hub's ``RateLimit: ...;t=N``."""
    value = headers.get("Retry-After")
    if value:
        try:
            return max(0.0, float(value))
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(value)
            except (TypeError, ValueError):
                when = None
            if when is not None:
                return max(0.0, when.timestamp() - time.time())
    match = _RATELIMIT_T.search(headers.get("RateLimit") or "")
    return float(match.group(1)) if match else None


class _GovernedSession(requests.Session):
    """The session huggingface_hub gets from ``get_session()`` once a governor is installed."""

    def __init__(self, governor: Governor) -> None:
        super().__init__()
        self.governor = governor

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        from huggingface_hub import constants
        from huggingface_hub.errors import OfflineModeIsEnabled

        if constants.HF_HUB_OFFLINE:
            raise OfflineModeIsEnabled(f"Cannot reach {request.url}: offline mode is enabled (HF_HUB_OFFLINE).")
        bucket = bucket_of(request.url or "")
        if bucket is None:
            return super().send(request, **kwargs)
        replays = 0
        while True:
            self.governor.acquire(bucket)
            try:
                response = super().send(request, **kwargs)
            finally:
                self.governor.release(bucket)
            if response.status_code != 429:
                return response
            wait = retry_after(response.headers)
            self.governor.pause(bucket, DEFAULT_PAUSE_S if wait is None else wait)
            # A streamed body (an upload) cannot be sent twice from here; its caller retries.
            if replays >= MAX_REPLAYS or not isinstance(request.body, (bytes, str, type(None))):
                return response
            replays += 1
            response.close()
