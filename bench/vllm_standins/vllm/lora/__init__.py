"""Stand-in package (prefixcache, for vLLM's block unit tests): see request.py."""
