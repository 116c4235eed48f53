"""The pytest plugin: tests of distributed and multiprocess code that can never wedge CI.

``plugin`` holds the hooks and options (registered through the ``pytest11`` entry point);
``watchdog`` enforces each test's deadline; ``processes`` finds, describes and asks for the
stacks of the processes a test started; ``leaks`` reports the ones it left behind.
"""
