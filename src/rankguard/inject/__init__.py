"""Fault injection: the grammar of ``--inject`` specs and the code that performs them in a rank."""

from .spec import FaultSpec, InjectedFault, parse

__all__ = ["FaultSpec", "InjectedFault", "parse"]
