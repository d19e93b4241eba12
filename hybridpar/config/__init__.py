"""Recipes: the YAML a user writes, loaded into dataclasses and checked before anything starts (no runtime imports)."""
