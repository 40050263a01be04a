"""A package-index client (PEP 691 simple API, core metadata, wheels read by HTTP range requests)."""
