"""Runnable examples of training with scalewatch's scalers."""
