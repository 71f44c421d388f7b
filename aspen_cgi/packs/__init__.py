"""Version packs (DESIGN §5): stored git packs and the responses built from them.

`packfile` reads a stored pack and its `.idx` as typed entries without
inflating anything; `splice` concatenates extents of stored packs into one
valid pack, copying the compressed bytes and rewriting only entry headers.
"""
