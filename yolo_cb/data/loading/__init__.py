"""Feeding a dataset to the loop: the loader, the task stream that spans epochs, and what a worker keeps between samples."""
