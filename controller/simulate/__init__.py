"""`dra-controller simulate`: pending claims allocated one after the other, as the cluster would."""
