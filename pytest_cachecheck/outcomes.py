"""A probe's four outcomes (a light module: the plugin imports it even when it is not enabled)."""

SAME, DIFFERENT, INCONCLUSIVE, ERROR = "same", "different", "inconclusive", "error"
