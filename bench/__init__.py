"""aspen-bench: measures Aspen against stock `git http-backend` (and any other
smart-HTTP server given by URL) in the same run on the same machine."""
