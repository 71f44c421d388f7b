"""The receive-pack service: commands, pack intake, checks, hooks, ref updates, report."""
