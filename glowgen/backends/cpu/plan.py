"""The cpu backend's decisions, recorded in the program by its LIR passes (passes.py) and
only read by code emission (codegen.py).

An instruction whose kernel has a choice gets an `InstrPlan` (`Instr.plan`): the strategy
its kernel takes, how its constant weights are packed, the scratch memory it needs.  The
program gets a `CpuPlan` (`Program.plan`): the target the decisions were made for, the
steps (stacks of elementwise instructions, products with a fused epilogue, single kernels),
how many tasks each step is split into, and where the kernels' scratch memory lies.
`glowgen dump --stage lir` prints both.
"""
from __future__ import annotations

from typing import Optional

import attrs

# A 2-D convolution's strategies (kernels/conv.py):
CONV_STRATEGIES = {
    "gemm": "matrix product over the whole im2col patch matrix, copied from padded planes",
    "gemm-panels": "matrix product, its patch matrix built one panel at a time (kept in L2)",
    "gemm-planes": "matrix product reading its patch matrix in place from the padded planes",
    "pointwise": "matrix product reading the input as its right-hand side (1x1, stride 1)",
    "transposed": "matrix product computed transposed, vectorized along the filters",
    "blocked": "transposed matrix product reading a channel-blocked (NCHWc) copy of the input in place",
    "winograd": "Winograd F(4x4, 3x3) or F(2x2, 3x3): a matrix product per position of transformed input windows",
    "planes": "direct convolution over padded planes in explicit vectors",
    "direct": "direct convolution in plain loops (any element type)",
}

# A ConvTranspose's (kernels/conv_transpose_gemm.py):
CONV_TRANSPOSE_STRATEGIES = {
    "interleaved": "matrix product over the KH x 2 taps, pairs of its rows interleaved into the output",
    "scatter": "each input element times each tap added into the output, in plain loops",
}


@attrs.define(eq=False)
class InstrPlan:
    """What the passes decided for one instruction's kernel."""
    strategy: Optional[str] = None      # its kernel's strategy (CONV_STRATEGIES for a Conv,
    #                                     CONV_TRANSPOSE_STRATEGIES for a ConvTranspose;
    #                                     "gemm" / "loops" for a product, "planes" / "loops"
    #                                     for a 2-D max pool)
    packed: Optional[str] = None        # its constant weights repacked (packing.py): "a" (the
    #                                     GEMM's A in MR-row blocks), "b" (B in NR-wide panels),
    #                                     "t" (a transposed convolution's B); None: as they are
    packed_nr: Optional[int] = None     # the width of B's packed panels ("b")
    scratch: int = 0                    # bytes of scratch memory one task of the kernel needs
    phases: Optional["Phases"] = None   # its tasks prepare data together first (Phases)

    def __str__(self) -> str:
        parts = []
        if self.strategy:
            parts.append(f"strategy {self.strategy}")
        if self.packed:
            parts.append(f"packed {self.packed}" + (f" nr {self.packed_nr}" if self.packed_nr else ""))
        if self.scratch:
            parts.append(f"scratch {self.scratch}")
        if self.phases:
            parts.append(str(self.phases))
        return ", ".join(parts)


@attrs.define(frozen=True)
class Phases:
    """A split kernel run as rounds of tasks, each round waiting for the last: the first
    rounds prepare data (an int8 product's plane) that every task of the last one reads,
    each task preparing its share once, where unphased every task prepares all it reads in
    scratch of its own (duplicated work that grows with the threads).  Float convolutions
    stay unphased: their cheap copies are faster read from each core's own cache."""
    count: int                          # rounds of the step's tasks
    shared: int                         # bytes of scratch the tasks share (before their own)
    # Bytes of claim words (one a task: parallel.for_claimed) at the end of the shared
    # scratch, which the caller zeroes before the first round; none where the last round's
    # tasks take fixed shares.
    claim_bytes: int = 0

    @property
    def claims(self) -> bool:
        """Whether the last round's tasks claim their work as they go."""
        return self.claim_bytes > 0

    @property
    def claim_words_at(self) -> int:
        """The claim words' byte offset in the shared scratch (its last claim_bytes)."""
        return self.shared - self.claim_bytes

    def __str__(self) -> str:
        return f"phases {self.count} (shared scratch {self.shared}{', claimed' if self.claims else ''})"


CLAIM_WORD_BYTES = 8                    # a task's claim word (parallel.for_claimed)


def claim_bytes(parts: int) -> int:
    """Bytes of the claim words of a step of `parts` tasks: whole cache lines of their own."""
    return -(-parts * CLAIM_WORD_BYTES // 64) * 64


@attrs.define(eq=False)
class CpuPlan:
    """What the passes decided for the whole program."""
    features: str                       # the target CPU's features ("+avx2,+fma,..."): what
    #                                     instruction choices may assume
    gemm_shape: object                  # the GEMM's register tile for them (gemm.GemmShape)
    threads: int = 1                    # threads a call may use
    stacking: bool = True               # stack elementwise runs into single loops
    winograd: bool = True               # 3x3 convolutions may run Winograd's (kernels/conv_winograd.py)
    steps: list = attrs.Factory(list)   # stacking.Step, in order: what the entry point calls
    scratch_offset: Optional[int] = None  # of the kernels' scratch memory in the activation
    #                                       region (None: no kernel needs any; its size, every
    #                                       task's share included: Program.scratch_bytes)

    def describe(self) -> list[str]:
        """The steps, one a line: `step 3: Conv+Add+Relu [1, 64, 56, 56] (epilogue Add+Relu)
        tasks 2 scratch 2x37120`."""
        from .stacking import describe_step
        shape = self.gemm_shape
        lines = [f"cpu plan {{ features {len(self.features.split(',')) if self.features else 0}, "
                 f"gemm tile {shape.mr}x{shape.nr} (vectors of {shape.vw}), threads {self.threads}, "
                 f"stacking {'on' if self.stacking else 'off'}"
                 + ("" if self.winograd else ", winograd off")
                 + (f", scratch act@{self.scratch_offset}" if self.scratch_offset is not None else "")]
        for i, step in enumerate(self.steps):
            text = f"  step {i:3d}: {describe_step(step)}"
            if step.stacked:
                text += f" (stack of {len(step.instrs)})"
            if step.epilogue is not None:
                text += f" (epilogue {'+'.join(ins.kind for ins in step.epilogue.instrs)})"
            if step.parts > 1:
                text += f" tasks {step.parts}" + (" (joined to the step before)" if step.joined else "")
            if step.shared_scratch:
                text += f" phases {step.phases} shared scratch {step.shared_scratch}"
            if step.scratch:
                text += f" scratch {step.parts}x{step.scratch}"
            lines.append(text)
        lines.append("}")
        return lines
