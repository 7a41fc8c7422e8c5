"""`dra-controller lint`: checks of the CEL selectors, and of where claims and workloads can be placed."""
