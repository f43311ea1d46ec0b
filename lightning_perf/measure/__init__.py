"""Probes: clocks, memory readers and streaming statistics. No Lightning import here."""
