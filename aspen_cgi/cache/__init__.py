"""The response cache (DESIGN §6): complete upload-pack responses kept on
local disk, computed once per key however many clients ask at once."""
