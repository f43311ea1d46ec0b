"""Memory: allocator peaks, NVML and RSS readers with the sampler thread, allocator health, memory phases (the user's
``phase`` too) and the allocator's recorded history. No Lightning import here."""
