"""Forensics: a failed or hung run investigated after the fact.

explain (a record's or a log's failure: its lead, its consequences, the shared state the
failing frames read, the remedy), suspects (that state found in the installed source) and
stacktool (pystack pushed into a container to take live stacks). It reads what watch/ parses
(tracebacks, causes, stacks) and goes to the target for the rest; nothing live depends on it.
"""
