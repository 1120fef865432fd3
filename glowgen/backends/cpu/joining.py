"""Steps run in one round of the thread pool: task p of a step right after task p of the
step before it, with no wait for the other tasks in between.

Every split step is a round of the pool: the caller publishes it, the workers take its
tasks, and the caller waits for the last one before the next step.  A step that reads only
what the same task of the step before wrote needs no such wait: MobileNetV2's depthwise
convolutions read each channel alone, and the expansion before them shares out its filters
in the same ranges (kernels/base.CHANNELS).  Joined, task p computes its channels of the
expansion and then, while they are in its core's cache, the depthwise convolution of the
same channels.

The other tasks of the first step may still be running while a task computes its share of
the second, so the second must write nothing the first reads or writes (the arena may have
put its result over the first's input, dead after it), and read nothing the first writes
but its own channels of the first's result.  Their tasks' scratch shares are made the same
size (passes.scratch), so that task p of the second never touches the share of task q of
the first.
"""
from __future__ import annotations

from ...lir.ir import Activation, dynamic_views
from ...lir.passes import lifetimes
from .kernels import CHANNELS
from .stacking import Step, is_control, stores_needed


def join_steps(prog, steps: list, gemm_shape) -> None:
    """Mark each step that can run in the round of the step before it (Step.joined); chains
    of two steps only."""
    life = lifetimes(prog)
    for first, second in zip(steps, steps[1:]):
        if not first.joined and can_join(first, second, gemm_shape, prog, life):
            second.joined = True


def _single(step: Step) -> bool:
    return (not is_control(step) and not step.stacked and not step.members and step.phases == 1
            and not step.shared_scratch and step.instrs[0].node is not None and step.instrs[0].plan is not None)


def can_join(first: Step, second: Step, gemm_shape, prog, life) -> bool:
    parts = first.parts
    if parts < 2 or second.parts != parts or not (_single(first) and _single(second)):
        return False
    a, b = first.instrs[0], second.instrs[0]
    ours, theirs = CHANNELS.get(a.kind), CHANNELS.get(b.kind)
    if ours is None or theirs is None:
        return False
    made, read = ours(a, gemm_shape, parts), theirs(b, gemm_shape, parts)
    if made is None or read is None or not read[1] or made[0] != read[0]:
        return False
    first_reads, first_writes = _touches(first, prog, life)
    x = b.reads()[0]
    if (len(first_writes) != 1 or x.root() is not first_writes[0].root()
            or x.nbytes != first_writes[0].nbytes or dynamic_views(x)):
        return False
    second_reads, second_writes = _touches(second, prog, life)
    for buf in second_writes:
        if not isinstance(buf.root(), Activation) or any(_overlap(buf, o) for o in first_reads + first_writes):
            return False
    return not any(buf is not x and _overlap(buf, o) for buf in second_reads for o in first_writes)


def _touches(step: Step, prog, life) -> tuple[list, list]:
    """(buffers read, buffers written) in memory by a single kernel's step: with an
    epilogue, not the intermediates that stay in registers."""
    writes = [buf for ins in step.instrs for buf in ins.writes()]
    if step.epilogue is not None:
        writes = [ins.writes()[0] for ins, need in zip(step.instrs, stores_needed(step, prog, life)) if need]
    reads, written = [], set()
    for ins in step.instrs:
        reads += [buf for buf in ins.reads() if id(buf.root()) not in written]
        written.update(id(buf.root()) for buf in ins.writes())
    return reads, writes


def _overlap(p, q) -> bool:
    """Whether two buffers may share bytes: those of the activation arena by their roots'
    places in it, others only when they are the same buffer."""
    p, q = p.root(), q.root()
    if p is q:
        return True
    if not (isinstance(p, Activation) and isinstance(q, Activation)):
        return False
    return p.offset < q.offset + max(q.nbytes, 1) and q.offset < p.offset + max(p.nbytes, 1)
