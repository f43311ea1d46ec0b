"""Evaluation done wrong: eval-mode forwards with grad on, graphs kept alive, modules left in training mode."""
