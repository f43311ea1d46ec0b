"""The device's activity and energy, read on the memory sampler's thread. No Lightning import here."""
