"""Statistics in bounded memory: the streaming histogram and block series, intervals of ratios, round-blocked
intervals."""
