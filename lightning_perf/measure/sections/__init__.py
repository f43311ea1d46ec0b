"""Sections of an iteration: the user's ``profile_section``, SectionProfiler's ledger, its checkpoint state and its
report, and the DataLoader workers' own time. No Lightning import here."""
