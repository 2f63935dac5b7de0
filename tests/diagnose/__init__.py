"""Tests of ``diagnose``."""
