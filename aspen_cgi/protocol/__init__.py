"""Pure wire formats: pkt-lines, capabilities, requests and advertisements.

Nothing here touches storage or starts a process, so it can be fuzzed alone.
"""
