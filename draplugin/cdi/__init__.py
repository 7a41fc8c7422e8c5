"""CDI: the spec model and its atomic writer."""
