"""The pip base's OS image: bootstrapped reproducibly with mmdebstrap and loaded into the engine."""
