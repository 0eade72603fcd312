"""Metrics: the catalogue of what collectors provide, series, collectors and storage."""
