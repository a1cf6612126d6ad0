"""Temporal workflows, activities and the worker entry point."""
