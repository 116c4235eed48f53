"""A process that turns on the rank runtime and waits: ``stacks_child.py MODE``.

It reads one line on stdin, calls ``rankguard.init()``, prints ``ready`` and then, by MODE:
``exit`` returns at once (a normal exit), ``wait`` waits for the next line on stdin (or EOF),
then returns.
"""
import sys

sys.stdin.readline()
import rankguard  # noqa: E402

rankguard.init(grace=2)
print("ready", flush=True)
if sys.argv[1] == "wait":
    sys.stdin.readline()
