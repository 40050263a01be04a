"""Recipes -> Plan: the build DAG, node hashes, arch/toolkit rules, sources, costs and the dry run's text."""
