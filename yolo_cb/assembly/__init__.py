"""A run's callbacks: the built-in ones every trainer has, the catalog of every registered name, and the set built
from the settings (defaults, the integrations they switch on, the user's and `callbacks=`)."""
