"""Compatibility shim: the build is configured in pyproject.toml."""

from setuptools import setup

setup()
