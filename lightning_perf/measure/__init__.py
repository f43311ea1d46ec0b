"""Probes, one package per thing measured: timing, sections, memory, device, stats, trials, quality, evaluation. No
Lightning import here."""
