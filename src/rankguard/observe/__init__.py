"""Looking at a run from outside, without touching it: ``rankguard stacks`` (and, to come,
``status`` and ``report``). Reads what a run writes (its journal, its stacks files) and asks
its ranks for their stacks; imports none of the faces."""
