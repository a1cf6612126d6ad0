"""Fault-injection qualification harness for durable agent runs."""

__version__ = "0.1.0"
