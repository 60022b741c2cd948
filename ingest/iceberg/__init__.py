"""Iceberg adapter: the only package that imports pyiceberg."""
