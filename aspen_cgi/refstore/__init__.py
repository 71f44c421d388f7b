"""The compacted ref store (DESIGN §3–4): every change to a repository's refs
is one version in an SQLite file beside the repository, with the per-ref
history compacted into aligned segments so that ancestry questions cost
O(log N) visits. `store.RefStore` is the entry point; `db` owns all SQL."""
