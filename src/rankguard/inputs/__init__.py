"""What users give rankguard beyond Python arguments: the command-line options shared by
``rankguard run`` and ``rankguard serve``, Python files imported by path, and torch's NCCL
settings that rankguard's ranks get unless the user set them."""
