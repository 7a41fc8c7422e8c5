"""`dra-controller run`, the daemon: reconciler, API writes and Events, leader election, caches, metrics."""
