"""Who is asking: the identities the API accepts and where it may listen without one."""
