"""Operator scripts."""
