"""The processes of a job as the operating system shows them: finding, signalling, killing and
awaiting them, reading from /proc what they wait on, asking them for their Python stacks, and
grouping ranks by where their stacks are."""
