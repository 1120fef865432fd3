"""A large program's LLVM module emitted and compiled by several processes at once.

A large model spends most of its compile time on one core: emitting its LLVM IR (llvmlite's
IR builder, in Python) and then optimizing it and generating its code (LLVM, which llvmlite
runs under one process-wide lock, so threads cannot share the work).  The step functions
are independent of each other: the entry points call them by name (codegen.py).  So this
process forks helpers; each helper and this process claim jobs from one shared counter,
biggest first, until none are left, and emit the functions of their jobs' steps.  A helper
optimizes its module and sends back its code; this process builds the entry points, which
declare the step functions it did not define.  The JIT links the helpers' object code to
them (MCJIT); a bundle links their optimized bitcode into its module, and generates the
code of the whole in one object file (bundle.py).

A helper that fails (no fork, a crash, an exception) or hangs loses nothing: this process
compiles the steps it claimed itself, where any error in them is raised as usual.

A job is the steps whose functions may be twins (job_key: codegen._shared_twin finds twins
among the functions of one module), so a split compiles no more code than one module.
Functions are never inlined across steps, so a step's machine code is the same either way.
"""
from __future__ import annotations

import json
import os
import select
import struct
import sys
import time
import warnings
from typing import Optional

from .stacking import is_control

# Fewest step functions for which a compile is split when no process count is asked for:
# below it forking costs more than it saves.
MIN_STEPS = 8

# How long this process waits for helpers once its own share is compiled: PATIENCE times
# what that share took, and at least PATIENCE_S seconds.  A helper still at work then (one
# that hangs) is stopped, and its steps are compiled here.
PATIENCE, PATIENCE_S = 10, 60.0


def job_key(step) -> tuple:
    """What two steps whose functions are twins have in common (a part of the twin key of
    codegen._shared_twin that needs no code)."""
    return (step.phases, tuple((ins.kind, tuple(buf.type if buf is not None else None for _, buf in ins.operands))
                               for ins in step.instrs))


def jobs_of(steps) -> list[list[int]]:
    """The function steps' indices grouped by job_key, the groups of most instructions
    first (claimed first: the long jobs then do not come last)."""
    groups: dict = {}
    for i, step in enumerate(steps):
        if not is_control(step):
            groups.setdefault(job_key(step), []).append(i)
    return sorted(groups.values(), key=lambda g: -sum(len(steps[i].instrs) for i in g))


def processes_for(steps, asked: Optional[int], cores: int) -> int:
    """How many processes compile `steps`: `asked` (at most one a job), else
    $GLOWGEN_COMPILE_PROCESSES, else this machine's cores for a program of at least
    MIN_STEPS functions; 1 where fork is unsafe (only Linux is trusted to fork a process
    that may run other threads)."""
    if not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        return 1
    functions = sum(1 for step in steps if not is_control(step))
    if asked is None:
        asked = _from_environment()
    if asked is None:
        asked = cores if functions >= MIN_STEPS else 1
    return max(1, min(asked, len(jobs_of(steps))))


ENV = "GLOWGEN_COMPILE_PROCESSES"


def _from_environment() -> Optional[int]:
    text = os.environ.get(ENV, "").strip()
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        from ...errors import GlowgenError
        raise GlowgenError(f"${ENV} must be a positive integer (processes that compile a model "
                           f"at once; 1: all in one), not {text!r}")
    return int(text)


class _Claims:
    """Jobs claimed one at a time from a counter shared by the forked processes."""

    def __init__(self, jobs: list[list[int]]):
        import multiprocessing
        self.jobs = jobs
        self.next = multiprocessing.get_context("fork").Value("l", 0)
        self.taken: list[int] = []          # the step indices this process claimed

    def __iter__(self):
        while True:
            with self.next.get_lock():
                k = self.next.value
                self.next.value = k + 1
            if k >= len(self.jobs):
                return
            self.taken += self.jobs[k]
            yield self.jobs[k]


def _helper(builder, claims: _Claims, compile_part, out_fd: int) -> None:
    """In a forked helper: the functions of the jobs it claims, compiled; to `out_fd`, a
    header (the steps defined, the code's size) and the code."""
    module = builder.step_functions(claims)
    obj = compile_part(builder.text(module)) if claims.taken else b""
    header = json.dumps({"steps": claims.taken, "bytes": len(obj)}).encode()
    data = struct.pack("<I", len(header)) + header + obj
    view = memoryview(data)
    while view:
        view = view[os.write(out_fd, view):]


def _read_all(fd: int, deadline: float) -> Optional[bytes]:
    """All a helper writes to `fd`, or None if it has not finished by `deadline`."""
    chunks = []
    while True:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return None
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _parse(data: bytes) -> Optional[tuple[list[int], bytes]]:
    """A helper's (steps, object), or None if it did not finish."""
    if len(data) < 4:
        return None
    (n,) = struct.unpack_from("<I", data)
    try:
        header = json.loads(data[4:4 + n])
    except ValueError:
        return None
    obj = data[4 + n:]
    return (header["steps"], obj) if len(obj) == header["bytes"] else None


class ProcessesBuild:
    """The program of `builder_factory()` (a codegen.ModuleBuilder) built by `processes`
    processes (1: this one alone, no helper).  Made, it has forked the helpers and built
    this process's module: `builder` and `text` (the entry points and the step functions
    it claimed); then `objects()`
    yields the code of every other step function as the helpers finish, from
    `compile_part(text of a module)` (object code for the JIT, bitcode for a bundle).
    Iterate it after compiling `text`: the helpers work meanwhile."""

    def __init__(self, builder_factory, processes: int, compile_part):
        import llvmlite.binding as llvm
        self._start = time.monotonic()
        self._factory, self._compile_part = builder_factory, compile_part
        self.builder = builder = builder_factory()
        self._helpers: list[tuple[int, int]] = []       # (pid, read end)
        self.failures: list[str] = []       # what went wrong with helpers (objects())
        if processes == 1:
            self.text, self._defined = builder.build_text(), None
            return
        claims = _Claims(jobs_of(builder.plan.steps))
        try:
            # Forked while holding llvmlite's lock: no other thread is inside LLVM, whose
            # locks a helper will take.
            with llvm.ffi.lib._lock:
                for _ in range(processes - 1):
                    self._fork(builder, claims, compile_part)
            self.text = builder.build_text(claims)
        except BaseException:
            self._stop_helpers()
            raise
        self._defined = set(claims.taken)

    def _fork(self, builder, claims: _Claims, compile_part) -> None:
        read_fd, write_fd = os.pipe()
        try:
            with warnings.catch_warnings():
                # Python 3.12 warns of forking a process that runs threads: a lock another
                # thread holds stays held in the child.  A helper takes none of theirs: it
                # runs LLVM (whose lock this thread holds) and this builder's Python code.
                warnings.filterwarnings("ignore", category=DeprecationWarning, message=".*fork")
                pid = os.fork()
        except OSError:                     # no helper: this process claims more jobs
            os.close(read_fd)
            os.close(write_fd)
            return
        if pid == 0:                        # the helper
            status = 1
            try:
                os.close(read_fd)
                _helper(builder, claims, compile_part, write_fd)
                status = 0
            finally:
                os._exit(status)
        os.close(write_fd)
        self._helpers.append((pid, read_fd))

    def _stop_helpers(self) -> None:
        """Interrupted, or out of patience: no helper outlives the compile."""
        for pid, read_fd in self._helpers:
            try:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
            except OSError:
                pass
            os.close(read_fd)
        self._helpers = []

    def objects(self):
        if self._defined is None:           # one process: every step is in `text`
            return
        now = time.monotonic()
        deadline = now + max(PATIENCE_S, PATIENCE * (now - self._start))
        try:
            while self._helpers:
                pid, read_fd = self._helpers[0]
                data = _read_all(read_fd, deadline)
                if data is None:            # still at work: stopped (_stop_helpers)
                    self.failures += [f"helper {pid} still at work after {time.monotonic() - now:.0f} s"
                                      for pid, _ in self._helpers]
                    break
                os.close(read_fd)
                self._helpers.pop(0)
                _, status = os.waitpid(pid, 0)
                result = _parse(data) if status == 0 else None
                if result is None:
                    self.failures.append(f"helper {pid} ended with status {status} after sending "
                                         f"{len(data)} bytes")
                else:
                    steps, obj = result
                    self._defined.update(steps)
                    if obj:
                        yield obj
        finally:
            self._stop_helpers()
        steps = self.builder.plan.steps
        missing = [i for i, step in enumerate(steps) if not is_control(step) and i not in self._defined]
        if missing:                         # a helper failed: its steps compiled here
            spare = self._factory()
            yield self._compile_part(spare.text(spare.step_functions([missing])))
