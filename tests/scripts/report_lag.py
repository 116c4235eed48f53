"""A rank that prints how late its completions may reach the ledger (set by the bootstrap)."""
from rankguard.runtime import instrument

print(f"lag={instrument.completions.lag!r}", flush=True)
