"""Plan -> images: the run loop, build contexts, the BuildKit engine and its progress, the wheelhouse, the journal, builders, the node cache and bake files."""
