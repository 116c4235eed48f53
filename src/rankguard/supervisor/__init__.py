"""The supervisor of rank processes: one class, :class:`RankProcesses`, that starts a set of
rank processes, watches them (pidfds in a selector, no polling), asks them for their stacks,
kills their process trees, reaps them and releases what they held.

Its users: the launcher's attempt (``launcher.ranks``), each replica of a ``rankguard.Pool``
(``serving.replica``) and the pytest plugin's warm ranks (``testing.warm_ranks``, through
serving's replica).

Layering: this folder sits below ``launcher/``, ``serving/`` and ``testing/`` and imports none of
them, nor the rank runtime (``runtime/``: the launcher must never import it); it builds on the
bottom modules only (``deadline``, ``ledger``, ``proctree``, ``stack_requests``,
``private_files``).

- ``rank_processes``: :class:`RankProcesses` and :class:`RankProcess` (one rank), :func:`spawn`.
- ``output``: a rank's output pipes, line by line, into its log and a terminal.
- ``exits``: waiting for any processes to end, on pidfds.
- ``guardian``: :class:`Guardian`, a process that ends the launcher's or a pool's processes
  once its owner is gone, however it died.
"""

from .rank_processes import RankFiles, RankProcess, RankProcesses, spawn

__all__ = ["RankFiles", "RankProcess", "RankProcesses", "spawn"]
