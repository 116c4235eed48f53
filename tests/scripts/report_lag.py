"""A rank that prints how late its completions may reach the ledger (set by the bootstrap)."""
from rankguard.runtime.state import current

print(f"lag={current().completions.lag!r}", flush=True)
