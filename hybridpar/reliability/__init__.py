"""Failures and stops: fault injection, replica checks, signals and time limits, and the run directory's ownership."""
