"""Registries: image references, pushes and pulls, manifest digests, logins, the node cache's parents, cluster jobs."""
