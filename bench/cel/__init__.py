"""CEL selector benchmark: raw engine speed vs. memoized selectors on realistic GPU fleets."""
