"""The one exception type that the command-line tools turn into a one-line message."""


class NmtError(Exception):
    """A user-facing error: bad input, a bad config value, a file that cannot be used."""


class ConfigError(NmtError):
    """A config value is missing or out of range; the message names the key."""
