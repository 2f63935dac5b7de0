"""Tests of ``packer``."""
