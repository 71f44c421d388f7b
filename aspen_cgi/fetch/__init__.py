"""The upload-pack service: advertisements, requests, planned answers from stored packs, git's answers behind the cache."""
