"""The executor: requests run through a network's partition DAG on the devices' workers.

Each device has one worker thread and a FIFO of partition calls: a device runs one call at a
time on its own threads, as a share of the machine.  A request starts every partition whose
inputs it has; a partition that finishes hands its outputs on and starts the partitions that
were waiting only for them.  So independent partitions of one request run at once on their
devices, and successive requests pipeline: while the second device runs request 1's tail,
the first runs request 2's head.  Each call runs in its own execution context (the compiled
models' context pools), so one partition can serve several requests at once from replicas.

Back-pressure: at most `max_pending` requests are accepted and unfinished; one more is
refused with QueueFull (nothing is dropped silently).  A bad request fails its own future
only.  close() stops accepting and drains what was accepted."""
from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Callable, Optional

import numpy as np

from ..errors import GlowgenError, InputError


class QueueFull(GlowgenError):
    """More requests pending than the host accepts."""


class HostClosed(GlowgenError):
    """The host is closed."""


class DeviceWorker:
    """One thread running a device's partition calls in order."""

    def __init__(self, name: str):
        self.name = name
        self._queue: deque = deque()
        self._ready = threading.Condition(threading.Lock())
        self._stop = False
        self.calls = 0
        self.busy_seconds = 0.0
        self._thread = threading.Thread(target=self._loop, name=f"glowgen-device-{name}", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], None]) -> None:
        with self._ready:
            self._queue.append(fn)
            self._ready.notify()

    def _loop(self) -> None:
        while True:
            with self._ready:
                while not self._queue and not self._stop:
                    self._ready.wait()
                if not self._queue:
                    return
                fn = self._queue.popleft()
            t0 = time.perf_counter()
            fn()                    # never raises: calls catch and fail their request
            self.busy_seconds += time.perf_counter() - t0
            self.calls += 1

    def stop(self) -> None:
        with self._ready:
            self._stop = True
            self._ready.notify()
        self._thread.join()


class Replica:
    """One copy of a network's partitions: what each reads and who waits for it."""

    def __init__(self, loaded, outputs, workers):
        self.parts = loaded                               # Loaded, in plan order
        local = {item.partition.index: i for i, item in enumerate(loaded)}
        self.deps = [[local[s] for s in item.partition.depends_on] for item in loaded]
        self.dependents = [[] for _ in loaded]
        for i, deps in enumerate(self.deps):
            for d in deps:
                self.dependents[d].append(i)
        self.roots = [i for i, deps in enumerate(self.deps) if not deps]
        self.workers = [workers[item.device.name] for item in loaded]
        self.outputs = outputs                            # [(output name, tensor name)]
        self.pending = 0                                  # requests running on it


class Request:
    __slots__ = ("replica", "feeds", "values", "waiting", "left", "future", "lock", "failed", "t0")

    def __init__(self, replica: Replica, feeds: dict, future: Future):
        self.replica = replica
        self.feeds = feeds
        self.values = dict(feeds)
        self.waiting = [len(d) for d in replica.deps]
        self.left = len(replica.parts)
        self.future = future
        self.lock = threading.Lock()
        self.failed = False
        self.t0 = time.perf_counter()


class Network:
    """A provisioned network as the executor runs it."""

    def __init__(self, name: str, signature, replicas: list, constants: dict):
        self.name = name
        self.signature = signature          # check_feeds(feeds) -> checked feeds
        self.replicas = replicas
        self.constants = constants          # outputs that are compile-time tensors
        self.completed = 0
        self.failed = 0
        self.latencies: deque = deque(maxlen=10000)


class Executor:
    def __init__(self, device_names, max_pending: int = 1024):
        if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 1:
            raise GlowgenError(f"max_pending must be a positive integer, not {max_pending!r}")
        self.workers = {name: DeviceWorker(name) for name in device_names}
        self.max_pending = max_pending
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._pending = 0
        self._closed = False
        self.refused = 0

    # ------------------------------------------------------------------ requests
    def submit(self, network: Network, feeds) -> Future:
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise HostClosed("the host is closed: it takes no more requests")
            if self._pending >= self.max_pending:
                self.refused += 1
                raise QueueFull(f"the host has {self._pending} requests pending, its limit "
                                f"(max_pending={self.max_pending}): wait for some to finish, "
                                f"or make the host with a larger max_pending")
            self._pending += 1
            replica = min(network.replicas, key=lambda r: r.pending)
            replica.pending += 1
        future.set_running_or_notify_cancel()
        try:
            checked = network.signature(feeds)
        except Exception as e:      # noqa: BLE001 - whatever the feeds did, it is this request's
            if not isinstance(e, GlowgenError):
                e = InputError(f"network {network.name!r}: bad request: {type(e).__name__}: {e}")
            self._finish(network, replica, None, future, error=e)
            return future
        request = Request(replica, checked, future)
        if not replica.parts:
            self._complete(network, request)
            return future
        for i in replica.roots:
            replica.workers[i].submit(lambda i=i: self._call(network, request, i))
        return future

    def _call(self, network: Network, request: Request, i: int) -> None:
        if request.failed:
            return self._part_done(network, request, None)
        item = request.replica.parts[i]
        try:
            feeds = {n: request.values[n] for n in item.input_names}
            out = item.model.run(feeds)
        except Exception as e:      # noqa: BLE001 - the request's own failure, on its future
            with request.lock:
                first = not request.failed
                request.failed = True
            if first:
                err = e if isinstance(e, GlowgenError) else GlowgenError(
                    f"network {network.name!r}, partition {item.partition.name} on device "
                    f"{item.device.name}: {type(e).__name__}: {e}")
                request.future.set_exception(err)
            return self._part_done(network, request, None)
        ready = []
        with request.lock:
            request.values.update(out)
            for j in request.replica.dependents[i]:
                request.waiting[j] -= 1
                if request.waiting[j] == 0:
                    ready.append(j)
        for j in ready:
            request.replica.workers[j].submit(lambda j=j: self._call(network, request, j))
        self._part_done(network, request, i)

    def _part_done(self, network: Network, request: Request, i) -> None:
        with request.lock:
            request.left -= 1
            last = request.left == 0
            # a failed request's partitions that never became ready will not run: count them
            if request.failed and not last:
                unstarted = sum(1 for w in request.waiting if w > 0)
                if request.left == unstarted:
                    request.left = 0
                    request.waiting = [0] * len(request.waiting)
                    last = True
        if last:
            self._complete(network, request)

    def _complete(self, network: Network, request: Request) -> None:
        if request.failed:
            return self._finish(network, request.replica, request, None, counted=True)
        try:
            result = {}
            for out, tensor in request.replica.outputs:
                if tensor in network.constants:
                    result[out] = network.constants[tensor].copy()
                elif tensor in request.feeds:               # an input passed through: a copy
                    result[out] = np.array(request.feeds[tensor], copy=True)
                else:
                    result[out] = request.values[tensor]
        except KeyError as e:       # an internal error: fail this request, keep serving
            request.failed = True
            request.future.set_exception(GlowgenError(f"network {network.name!r}: output tensor "
                                                      f"{e} was not computed"))
            return self._finish(network, request.replica, request, None, counted=True)
        self._finish(network, request.replica, request, request.future, result=result)

    def _finish(self, network, replica, request, future, error=None, result=None, counted=False):
        if error is not None:
            future.set_exception(error)
        elif future is not None:
            future.set_result(result)
        with self._lock:
            replica.pending -= 1
            self._pending -= 1
            if error is not None or counted:
                network.failed += 1
            else:
                network.completed += 1
                network.latencies.append(time.perf_counter() - request.t0)
            if self._pending == 0:
                self._idle.notify_all()

    # ------------------------------------------------------------------ lifetime
    @property
    def pending(self) -> int:
        return self._pending

    def drain(self, timeout: Optional[float] = None) -> bool:
        with self._lock:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def pending_on(self, network: Network) -> int:
        return sum(r.pending for r in network.replicas)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self.drain()
        for w in self.workers.values():
            w.stop()
