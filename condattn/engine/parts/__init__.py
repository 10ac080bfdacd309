"""The parts of the training loop (see base.Part for the hooks and when the loop calls them)."""

from .base import Part
from .budget import BudgetStop
from .checkpointing import Checkpointing
from .diagnostics import Diagnostics
from .divergence import Divergence
from .evaluation import BestModel
from .progress import Progress
from .signals import StopSignals
from .test_protocol import TestProtocol
from .throughput import Throughput

__all__ = ["BestModel", "BudgetStop", "Checkpointing", "Diagnostics", "Divergence", "Part", "Progress",
           "StopSignals", "TestProtocol", "Throughput"]
