"""Packaged data of opcast: hardware catalog, arch presets and first-party datasets."""
