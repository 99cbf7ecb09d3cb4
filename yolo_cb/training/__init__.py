"""The trainer and what only training needs: building a run's parts, the step, resume, signals, saving."""
