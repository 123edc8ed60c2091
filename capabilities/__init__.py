"""Capability manifests (one YAML per backend), shipped as package data."""
