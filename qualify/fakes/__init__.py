"""Fakes loaded into the real ``qimpl`` processes by configuration (never imported by qimpl)."""
