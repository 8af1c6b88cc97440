"""Regression tests for the outside review's findings (issue #11): real servers attacked over loopback,
every attack bounded in time and bytes."""
