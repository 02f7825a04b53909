"""Tests on a standalone cluster whose Workers run in their own network namespaces (root only)."""
