"""Tests against a real Spark standalone cluster on 127.0.0.1."""
