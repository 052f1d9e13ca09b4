"""HTTP plumbing every route shares: the parser, limits, errors, ids, request and response bodies, readers."""
