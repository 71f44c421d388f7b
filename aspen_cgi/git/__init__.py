"""The door to git: the one place that starts processes, a repository's configuration, refs read through git, hooks."""
