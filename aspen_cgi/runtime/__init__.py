"""Process-wide facilities below the rooms: admission slots, state directories, guards for background work, process identity, metrics counters, memos."""
