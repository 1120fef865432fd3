"""The plan of a network over devices, as data: its partitions, where each runs, what each
holds in memory and which tensors cross between them.  `to_text()` and `to_dot()` show it
(`glowgen partition`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .devices import format_bytes


@dataclass
class Tensor:
    """A tensor crossing into a partition: its name, bytes, and the partition that computes
    it (None: an input of the network)."""
    name: str
    nbytes: int
    source: Optional[int]
    type: str = ""


@dataclass
class Partition:
    index: int                      # its place in plan.partitions
    name: str
    device: str                     # the device's name
    kind: str                       # the device's backend
    nodes: list                     # names of the optimized graph's nodes it computes
    inputs: list                    # Tensor: what it reads from the network or other partitions
    outputs: list                   # names of the tensors it computes for others or the caller
    weights: int = 0                # estimated bytes of weights
    activations: int = 0            # estimated bytes of inputs, outputs and peak activations
    flops: float = 0.0              # estimated work
    replica: int = 0
    reason: str = ""                # why it is cut where it is ("fits", "memory", "support", "user")
    compiled_memory: Optional[int] = None   # bytes its compiled program takes (once provisioned)

    @property
    def memory(self) -> int:
        """Bytes it takes on its device: the compiled program's once provisioned, the
        estimate (weights + inputs + outputs + peak activations) before."""
        if self.compiled_memory is not None:
            return self.compiled_memory
        return self.weights + self.activations

    @property
    def depends_on(self) -> list:
        return sorted({t.source for t in self.inputs if t.source is not None})


@dataclass
class Plan:
    network: str
    partitions: list = field(default_factory=list)
    inputs: list = field(default_factory=list)      # the network's input names
    outputs: list = field(default_factory=list)     # (output name, tensor, partition index | "input" | "constant")
    devices: list = field(default_factory=list)     # Device.describe() of every device of the host
    replicas: int = 1

    def replica(self, r: int) -> list:
        return [p for p in self.partitions if p.replica == r]

    def crossing_bytes(self, r: int = 0) -> int:
        return sum(t.nbytes for p in self.replica(r) for t in p.inputs if t.source is not None)

    # ------------------------------------------------------------------ text
    def to_text(self) -> str:
        lines = [f"network {self.network}: {len(self.replica(0))} partition"
                 f"{'s' if len(self.replica(0)) != 1 else ''}"
                 + (f" x {self.replicas} replicas" if self.replicas > 1 else "")
                 + f", {format_bytes(self.crossing_bytes())} crossing between partitions per request"]
        if self.devices:
            lines.append("devices  " + "; ".join(self.devices))
        for p in self.partitions:
            gflops = p.flops / 1e9
            lines.append(f"partition {p.index} {p.name} on {p.device} ({p.kind})"
                         + (f" replica {p.replica}" if self.replicas > 1 else "")
                         + f": {len(p.nodes)} node{'s' if len(p.nodes) != 1 else ''}, memory "
                         f"{format_bytes(p.memory)} (weights {format_bytes(p.weights)}, inputs, outputs, "
                         f"activations {format_bytes(p.activations)}"
                         + (", compiled" if p.compiled_memory is not None else ", estimated")
                         + f"), {gflops:.3f} GFLOP" + (f", {p.reason}" if p.reason else ""))
            nodes = ", ".join(p.nodes[:6]) + (f", ... ({len(p.nodes) - 6} more)" if len(p.nodes) > 6 else "")
            lines.append(f"  nodes    {nodes}")
            for t in p.inputs:
                src = "network input" if t.source is None else f"from partition {t.source}"
                lines.append(f"  in       {t.name} {t.type} ({format_bytes(t.nbytes)}) {src}")
            for name in p.outputs:
                lines.append(f"  out      {name}")
        for out, tensor, src in self.outputs:
            where = {"input": "a network input", "constant": "a constant"}.get(src, f"partition {src}")
            lines.append(f"output {out} <- {tensor} ({where})")
        return "\n".join(lines) + "\n"

    # ------------------------------------------------------------------ dot
    def to_dot(self) -> str:
        def q(s: str) -> str:
            return '"' + str(s).replace("\\", "\\\\").replace('"', '\\"') + '"'

        lines = [f"digraph {q(self.network)} {{", "  rankdir=TB;",
                 '  node [shape=box, style="rounded,filled", fillcolor="#eef3fb", fontname="Helvetica"];',
                 '  edge [fontname="Helvetica", fontsize=10];']
        for name in self.inputs:
            lines.append(f"  {q('in:' + name)} [label={q(name)}, shape=ellipse, fillcolor=white];")
        for p in self.partitions:
            label = (f"{p.name}\\n{p.device} ({p.kind})\\n{len(p.nodes)} nodes, "
                     f"{format_bytes(p.memory)}\\n{p.flops / 1e9:.2f} GFLOP")
            lines.append(f"  {q(p.name)} [label={q(label).replace(chr(92) * 2 + 'n', chr(92) + 'n')}];")
        for p in self.partitions:
            for t in p.inputs:
                src = q("in:" + t.name) if t.source is None else q(self.partitions[t.source].name)
                lines.append(f"  {src} -> {q(p.name)} [label={q(t.name + ' ' + format_bytes(t.nbytes))}];")
        for out, tensor, src in self.outputs:
            lines.append(f"  {q('out:' + out)} [label={q(out)}, shape=ellipse, fillcolor=white];")
            if src == "input":
                lines.append(f"  {q('in:' + tensor)} -> {q('out:' + out)};")
            elif src == "constant":
                lines.append(f"  {q('const:' + tensor)} [label={q(tensor)}, shape=note, fillcolor=white];")
                lines.append(f"  {q('const:' + tensor)} -> {q('out:' + out)};")
            else:
                for p in self.partitions:
                    if tensor in p.outputs and p.replica == 0:
                        lines.append(f"  {q(p.name)} -> {q('out:' + out)};")
        lines.append("}")
        return "\n".join(lines) + "\n"
