"""The `git http-backend` contract: environment, routes, headers, bodies, dumb files."""
