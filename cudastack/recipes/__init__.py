"""Recipes as data: the typed models of recipes/*.yaml, loading and cross-file checks, method selection."""
