"""attnlab lab: a local web page to sample from a checkpoint, look inside its attention, switch heads
off and read a run's curves. Standard library HTTP server, a small JSON API, vanilla JS (lab/static/)."""
