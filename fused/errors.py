"""The one error every command reports as a single line: a value that cannot work."""


class ConfigError(ValueError):
    """A configuration value that cannot work; the message names the field and the fix."""

