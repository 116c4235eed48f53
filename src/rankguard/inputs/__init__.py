"""What users give rankguard beyond Python arguments: the command-line options shared by
``rankguard run`` and ``rankguard serve``, and Python files imported by path."""
