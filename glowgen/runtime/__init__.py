"""The runtime (Glow's HostManager): devices, a partitioner, a provisioner and an executor
behind `Host`.  See host.py."""
from .devices import Device
from .executor import HostClosed, QueueFull
from .host import Host
from .plan import Partition, Plan

__all__ = ["Host", "Device", "Plan", "Partition", "QueueFull", "HostClosed"]
