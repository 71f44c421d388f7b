"""Pure values: object ids, refs, ref names, git's value syntax, the ref store's records."""
