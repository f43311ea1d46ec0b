"""What every callback of the suite shares: the base class and its guards, argument checks, scalar logging, checkpoint
state reading, the summary book, gathering across ranks, the printer thread and the run block."""
