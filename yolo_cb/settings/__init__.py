"""The settings: defaults, the user's file, cfg= files and overrides, resolved once, typed and checked."""
