"""A/B trials inside one run: the block schedule and paired statistics, the switchable changes, the user's named
changes and quality per arm."""
