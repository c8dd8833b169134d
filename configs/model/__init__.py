"""Model rows (+model=small|base|big): YAML only; a package so that the wheel ships it."""
