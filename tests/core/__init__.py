"""Tests of ``core``."""
